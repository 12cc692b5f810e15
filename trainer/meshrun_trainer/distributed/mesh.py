"""Process group and DeviceMesh setup.

Mesh dimensions are (pp, dp, dp_shard, cp, tp), torchtitan's order: TP innermost, so a TP group
is consecutive ranks inside one pod, then CP, then data parallelism, PP outermost, matching the
planner's rank order rank = ((pp * dp_size + dp) * cp_size + cp) * tp + tp_rank.
``dp_shard`` always has size 1: with ``dp`` it forms the 2-D mesh on which FSDP2 replicates
without sharding (HSDP with shard size 1), the data parallelism hybrids use at ZeRO stage 0.

Context parallelism splits each sequence over the cp ranks; every parameter is replicated over
them, so gradients are reduced over dp x cp together: ``dp_cp`` is (dp, dp_shard, cp) flattened
into one dimension (data parallelism's group when cp > 1), and ``dp_shard_cp`` (dp_shard, cp)
flattened, the dimension FSDP2 shards over when it replicates over ``dp`` (torchtitan's
``dp_shard_cp``). With cp 1 they are ``dp`` and ``dp_shard`` themselves. ``cp_tp`` is (cp, tp)
flattened when both are above 1: the ranks holding the other shards of a rank's sequences (a
MoE layer's auxiliary loss adds their sums up). Under tensor parallelism ``dp_shard_cp_tp`` and
``dp_cp_tp`` flatten the data-parallel dimensions with ``tp``, so that DTensor reduces a
gradient norm that is partial over both in one all-reduce.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from meshrun.api.layout import Layout
from meshrun.api.spec import CPU
from meshrun.localnet import free_port
from meshrun_trainer.distributed.hostmemory import return_freed_memory


class NoAcceleratorError(RuntimeError):
    """The pod asked for GPUs (nvidia.com/gpu) but this process finds no usable CUDA device.

    Permanent: a restart on the same nodes would find the same; training on the CPU instead
    would be silently slower by orders of magnitude."""


def pick_device(accelerator: str | None = None) -> torch.device:
    """The process's device: cuda:LOCAL_RANK for ``nvidia.com/gpu`` (NoAcceleratorError when
    it is missing or broken), the CPU for ``cpu``; None (tests, benches): CUDA when present."""
    if accelerator == CPU or (accelerator is None and not torch.cuda.is_available()):
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")
    if not torch.cuda.is_available() or torch.cuda.device_count() <= index:
        raise NoAcceleratorError(
            f"spec.resources.accelerator is {accelerator or 'nvidia.com/gpu'} but local rank "
            f"{index} sees {torch.cuda.device_count()} CUDA device(s) (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}, CUDA_VISIBLE_DEVICES="
            f"{visible}); not falling back to the CPU"
        )
    try:
        torch.cuda.set_device(index)
        torch.zeros(1, device=f"cuda:{index}")  # a broken driver or device fails here
    except RuntimeError as error:
        raise NoAcceleratorError(f"CUDA device {index} is not usable: {error}") from error
    return torch.device("cuda", index)


def init_distributed(device: torch.device, timeout_s: float = 600.0) -> None:
    """Join the job's process group (env:// rendezvous set up by torchrun).

    "cpu:gloo,cuda:nccl" fails on CPU-only builds of torch, so pick one backend. Every trainer
    process comes here first, so this is where freed host memory starts going back to the
    system (meshrun_trainer.distributed.hostmemory).
    """
    if dist.is_initialized():
        return
    return_freed_memory()
    if "RANK" not in os.environ:
        # Started without torchrun (`python -m meshrun_trainer`): a world of one process.
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


@dataclass(frozen=True)
class Mesh:
    """The mesh and this rank's coordinates in it."""

    device_mesh: DeviceMesh
    """Mesh with dimensions ("pp", "dp", "dp_shard", "cp", "tp"); dp_shard has size 1."""
    device: torch.device
    """Where this rank computes."""
    pp_rank: int
    """Pipeline stage index of this rank (before interleaving)."""
    dp_rank: int
    """Data-parallel replica index of this rank."""
    tp_rank: int
    """Position inside the tensor-parallel group."""
    cp_rank: int = 0
    """Position inside the context-parallel group (which chunks of each sequence it holds)."""

    def group(self, dim: str) -> dist.ProcessGroup:
        return self.device_mesh[dim].get_group()

    @property
    def cp(self) -> int:
        """The context-parallel degree (1 on a mesh without a cp dimension)."""
        names = self.device_mesh.mesh_dim_names or ()
        return self.device_mesh["cp"].size() if "cp" in names else 1

    def gradient_mesh(self, replicate: bool) -> DeviceMesh:
        """Where data parallelism reduces gradients: dp x cp in one dimension, or with
        ``replicate`` the 2-D (dp, dp_shard x cp) mesh of HSDP."""
        if replicate:
            return self.device_mesh["dp", _DP_SHARD_CP if self.cp > 1 else "dp_shard"]
        return self.device_mesh[_DP_CP if self.cp > 1 else "dp"]

    def gradient_group(self) -> dist.ProcessGroup:
        """The ranks that hold the same parameters and see other tokens: dp x cp."""
        return self.gradient_mesh(replicate=False).get_group()

    def sequence_group(self) -> dist.ProcessGroup | None:
        """The ranks holding the other shards of this rank's sequences: cp x tp (None: they
        are whole here)."""
        names = self.device_mesh.mesh_dim_names or ()
        tp = self.device_mesh["tp"].size() if "tp" in names else 1
        if self.cp > 1 and tp > 1:
            return self.group(_CP_TP)
        if self.cp > 1 or tp > 1:
            return self.group("cp" if self.cp > 1 else "tp")
        return None


_DP_CP, _DP_SHARD_CP, _CP_TP = "dp_cp", "dp_shard_cp", "cp_tp"
_DP_CP_TP, _DP_SHARD_CP_TP = "dp_cp_tp", "dp_shard_cp_tp"


def leave(code: int) -> NoReturn:
    """End a rank whose process groups are destroyed and whose files are closed, without the
    interpreter's teardown: in it gloo's threads can abort a rank that did all its work
    ("terminate called without an active exception", SIGABRT, in a thread with no Python
    frame), seen in the suite's test launches after their work and once in a two-rank local
    run, whose rank then counted as failed, as a pod would. Logging is shut down and stdout
    and stderr flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def build_mesh(layout: Layout, device: torch.device) -> Mesh:
    """Create the mesh over the whole world; the world size must match the layout."""
    world = dist.get_world_size()
    assert world == layout.world_size, f"world {world} != layout {layout.world_size}"
    mesh = init_device_mesh(
        device.type,
        (layout.pp, layout.dp, 1, layout.cp, layout.tp),
        mesh_dim_names=("pp", "dp", "dp_shard", "cp", "tp"),
    )
    if layout.cp > 1:
        mesh["dp", "dp_shard", "cp"]._flatten(_DP_CP)
        mesh["dp_shard", "cp"]._flatten(_DP_SHARD_CP)
        if layout.tp > 1:
            mesh["cp", "tp"]._flatten(_CP_TP)
    if layout.tp > 1:
        # A tensor-parallel parameter's gradient norm is partial over its data-parallel and
        # TP dimensions: with them flattened here DTensor reduces it in one all-reduce, not
        # one per dimension in a row (which torch warns of on every rank).
        mesh["dp_shard", "cp", "tp"]._flatten(_DP_SHARD_CP_TP)
        if layout.dp * layout.cp > 1:
            mesh["dp", "dp_shard", "cp", "tp"]._flatten(_DP_CP_TP)
    return Mesh(
        device_mesh=mesh,
        device=device,
        pp_rank=mesh.get_local_rank("pp"),
        dp_rank=mesh.get_local_rank("dp"),
        tp_rank=mesh.get_local_rank("tp"),
        cp_rank=mesh.get_local_rank("cp"),
    )
