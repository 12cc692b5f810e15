"""The run's configuration as the trainer reads it: the typed settings, the layout, the job's own
run."""
