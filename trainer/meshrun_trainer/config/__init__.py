"""The job as the trainer reads it: the core's spec, plan and pod from the job document, and the
job's own files."""
