"""Batches: synthetic tokens per (seed, step), tokenized text and its fixed windows."""
