"""The meshrun trainer: real torch distributed training for every strategy meshrun plans.

One process per GPU (or CPU slot) under torchrun; everything comes from the environment the
operator sets (docs/env-contract.md). The packages, lower never importing higher (the
import-linter contracts of pyproject.toml):

- ``config`` / ``models``: the typed configuration and its rules, read from the job document
  (MESHRUN_JOB);
  a Llama-like decoder built from meshrun.api.presets, initialised identically on every rank
  before splitting, and Hugging Face weights.
- ``distributed``: process group (nccl on CUDA, else gloo) and the (pp, dp, tp) DeviceMesh; the
  strategies. DDP; ZeRO-1 = DDP + ZeroRedundancyOptimizer; ZeRO-2/3 = FSDP2 fully_shard with
  reshard_after_forward False/True; TP = DTensor parallelize_module with sequence parallel;
  PP = torch.distributed.pipelining (GPipe, 1F1B, Interleaved1F1B); hybrids compose TP, then
  FSDP2 on the dp dimension, inside pipeline stages.
- ``runner``: this rank's model parts, optimizers and schedule, shared by the loop and the
  components.
- ``components``: data, DCP checkpoints with atomic visibility, the optimizer (gradient clipping
  combines norms across TP/DP shards and pipeline stages), evaluation, JSON step lines,
  /metrics and /progress, the termination message.
- ``loop`` (the training loop and a job's own hooks) and ``local`` (``meshrun run FILE --local``).
- ``main`` (``python -m meshrun_trainer``).
"""
