"""The model: a Llama-like decoder from the presets, Hugging Face weights, materialised on each
rank."""
