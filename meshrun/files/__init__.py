"""A job's own files (model folder, data, tokenizer): the only part of the core that reads disk."""
