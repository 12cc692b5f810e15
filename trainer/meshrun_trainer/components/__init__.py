"""What a training loop calls: data, checkpoints, the optimizer, evaluation, progress reports."""
