"""The meshrun trainer: real torch distributed training for every strategy."""
