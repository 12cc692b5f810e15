"""The training loop and the hooks of a job's own run (validation, weights)."""
