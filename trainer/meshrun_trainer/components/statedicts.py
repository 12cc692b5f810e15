"""Model and optimizer state of a rank's model parts, in one layout-free naming for DCP.

Every tensor is keyed by the model's own parameter names (``layers.3.attention.wq.weight``;
no DDP, compile or checkpoint wrapper prefixes) and held as this rank's piece of it: a DTensor
shard under FSDP2 or tensor parallelism, a whole tensor otherwise. DCP records which piece of
which global tensor each rank wrote, so a checkpoint saved under one layout loads under any
other (different dp, tp, pp, ZeRO stage or world size): each rank reads the pieces its own
layout needs.

Optimizer state uses torch's flattened form (``state.<name>.exp_avg``,
``param_groups.<name>.lr``, from ``get_optimizer_state_dict``) for every ZeRO stage. ZeRO-1's
ZeroRedundancyOptimizer assigns whole parameters to ranks; :func:`zero1_state` writes the same
keys for the parameters this rank owns, so every entry is written once, by its owner, and a
ZeRO-1 run reads back exactly the parameters it owns, from a checkpoint of any layout.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from meshrun_trainer.components.safeload import SafePlanner, SafeReader, UnsafeCheckpoint
from meshrun_trainer.models.materialize import canonical_name

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from meshrun_trainer.runner import Runner


class CheckpointMismatch(RuntimeError):
    """A checkpoint lacks state this run needs (another model, or a damaged checkpoint)."""


FLAT = StateDictOptions(flatten_optimizer_state_dict=True)
STRICT = StateDictOptions(strict=True, flatten_optimizer_state_dict=True)


def _owned(model: nn.Module, optimizer: ZeroRedundancyOptimizer) -> list[tuple[str, Any, Any]]:
    """(name, parameter, param group) of each parameter this rank's ZeRO-1 shard updates; the
    group is ZeroRedundancyOptimizer's own (a learning-rate schedule changes that one, and
    ZeroRedundancyOptimizer copies it into the shard's optimizer at each step)."""
    names = {id(p): canonical_name(n) for n, p in model.named_parameters()}
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    local: torch.optim.Optimizer = optimizer.optim
    return [(names[id(p)], p, groups[id(p)]) for g in local.param_groups for p in g["params"]]


def _init_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state tensors (a step with zero gradients and learning rate 0),
    so a load has tensors to fill."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    for param in params:
        param.grad = torch.zeros_like(param)
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    optimizer.zero_grad(set_to_none=True)


def zero1_state(model: nn.Module, optimizer: ZeroRedundancyOptimizer) -> dict[str, Any]:
    """This rank's ZeRO-1 shard of the optimizer state, in the flattened form."""
    _init_state(optimizer.optim)
    local: torch.optim.Optimizer = optimizer.optim
    flat: dict[str, Any] = {}
    for name, param, group in _owned(model, optimizer):
        for key, value in local.state[param].items():
            flat[f"state.{name}.{key}"] = value
        for key, value in group.items():
            if key != "params":
                flat[f"param_groups.{name}.{key}"] = value
    return flat


def load_zero1_state(
    model: nn.Module, optimizer: ZeroRedundancyOptimizer, flat: dict[str, Any]
) -> None:
    """Put a loaded :func:`zero1_state` back (tensors were loaded in place)."""
    local: torch.optim.Optimizer = optimizer.optim
    for name, param, group in _owned(model, optimizer):
        for key in local.state[param]:
            local.state[param][key] = flat[f"state.{name}.{key}"]
        for key in group:
            if key != "params":
                group[key] = flat[f"param_groups.{name}.{key}"]


def _zero1(optimizer: torch.optim.Optimizer) -> TypeGuard[ZeroRedundancyOptimizer]:
    """Whether ``optimizer`` is ZeRO-1's, without importing torch.distributed.optim where none
    was made: its functional optimizers are compiled by TorchScript at import, a third of a
    second of CPU in every process (meshrun_trainer.components.optim imports it on demand)."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


def part_states(runner: Runner) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(model, optimizer) state of each model part, to save or to load into."""
    states = []
    for part, opt in zip(runner.parts, runner.optimizers, strict=True):
        if _zero1(opt):
            optim = zero1_state(part, opt)
        else:
            optim = get_optimizer_state_dict(part, opt, options=FLAT)
        states.append((get_model_state_dict(part), optim))
    return states


def merged(states: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The application state DCP saves: {"model": {...}, "optim": {...}} over all parts."""
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part_model, part_optim in states:
        model.update(part_model)
        optim.update(part_optim)
    return {"model": model, "optim": optim}


def apply(
    runner: Runner, states: list[tuple[dict[str, Any], dict[str, Any]]], loaded: dict[str, Any]
) -> None:
    """Set each part's model and optimizer after DCP loaded ``loaded`` (the :func:`merged` of
    ``states``: tensors load in place, other values are replaced in ``loaded``). Strict: a key
    the part has and the checkpoint lacks is an error."""
    for part, opt, (part_model, part_optim) in zip(
        runner.parts, runner.optimizers, states, strict=True
    ):
        model = {key: loaded["model"][key] for key in part_model}
        optim = {key: loaded["optim"][key] for key in part_optim}
        set_model_state_dict(part, model, options=STRICT)
        if _zero1(opt):
            load_zero1_state(part, opt, optim)
        else:
            set_optimizer_state_dict(part, opt, optim, options=STRICT)


def load(loaded: dict[str, Any], directory: str, no_dist: bool = False) -> None:
    """DCP's load of :func:`merged` state from ``directory``; collective unless ``no_dist``.

    Strict: every key must be in the checkpoint, else CheckpointMismatch names the keys (DCP
    itself raises a BaseException carrying each rank's error). Nothing in the checkpoint runs
    as code: its metadata and values are read by safeload's reader and planner, and a file
    that names anything else raises UnsafeCheckpoint naming it."""
    reader = SafeReader(directory)
    # Refused here, before DCP, which logs a failed metadata read with its traceback, tries the
    # rank's own metadata, and logs again: a refusal is one clear line.
    with contextlib.suppress(FileNotFoundError):  # DCP then reads the rank's own metadata
        reader.read_metadata()
    try:
        dcp_load(loaded, storage_reader=reader, planner=SafePlanner(directory), no_dist=no_dist)
    except CheckpointException as error:
        failed = [failure[0] for failure in error.failures.values()]
        unsafe = [reader.refused, *(f for f in failed if isinstance(f, UnsafeCheckpoint))]
        if any(unsafe):
            raise next(u for u in unsafe if u is not None) from None
        reasons = sorted({str(failure) for failure in failed})
        raise CheckpointMismatch(f"{directory}: {'; '.join(reasons)}") from None
