"""The meshrun trainer: real torch distributed training for every strategy meshrun plans.

One process per GPU (or CPU slot) under torchrun; everything comes from the environment the
operator sets (docs/env-contract.md). The layers, lower never importing higher:

- ``layout`` / ``config``: the typed configuration and its rules, read from MESHRUN_* variables.
- ``mesh``: process group (nccl on CUDA, else gloo) and the (pp, dp, tp) DeviceMesh.
- ``model`` / ``data``: a Llama-like decoder built from meshrun.api.presets, initialised identically
  on every rank before splitting; a deterministic batch per (seed, step) for every layout.
- ``parallel`` / ``pipeline`` / ``optim``: the strategies. DDP; ZeRO-1 = DDP +
  ZeroRedundancyOptimizer; ZeRO-2/3 = FSDP2 fully_shard with reshard_after_forward False/True;
  TP = DTensor parallelize_module with sequence parallel; PP = torch.distributed.pipelining
  (GPipe, 1F1B, Interleaved1F1B); hybrids compose TP, then FSDP2 on the dp dimension, inside
  pipeline stages. Gradient clipping combines norms across TP/DP shards and pipeline stages.
- ``train`` / ``checkpoint`` / ``progress``: the loop, DCP checkpoints with atomic visibility,
  JSON step lines, /metrics and /progress, the termination message.
- ``main`` (``python -m meshrun_trainer``) and ``local`` (``meshrun run FILE --local``).
"""
