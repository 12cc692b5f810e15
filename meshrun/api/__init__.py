"""The ParallelTrainingJob API: the CRD, the typed spec, its reader, its errors, the presets."""
