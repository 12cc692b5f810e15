"""The meshrun operator: reconciles ParallelTrainingJobs (kopf)."""
