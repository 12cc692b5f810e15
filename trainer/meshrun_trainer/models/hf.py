"""Hugging Face weights in and out, through torch DCP's safetensors reader and writer.

In: :class:`SafetensorsSource` fills the parameters each rank holds, right after they are
allocated: every rank asks DCP for them, named as transformers names them, and
``HuggingFaceStorageReader`` reads only the slices each rank's shards cover (safetensors
slicing), so no rank ever reads the whole model. Out: every rank hands DCP its shards,
``HuggingFaceStorageWriter`` writes them and consolidates them into full safetensors files, and
the folder appears under its final name only once complete (config.json and tokenizer files
included).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.hf_storage import (
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from meshrun.api.errors import SpecError
from meshrun.api.presets import ModelShape
from meshrun.files.bounded import read_text_bounded
from meshrun.files.hf import FIELD, SUPPORTED, TOKENIZER_FILES, moe_names, side_file

_BLOCK = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
"""Module path inside a block -> transformers' (SwiGLU: w1 gate, w3 up, w2 down)."""
_MOE = {
    "router": "gate",
    "shared.w1": "shared_expert.gate_proj",
    "shared.w2": "shared_expert.down_proj",
    "shared.w3": "shared_expert.up_proj",
    "shared_gate": "shared_expert_gate",
}
"""Module path inside a MoE layer -> transformers' (under the architecture's MoE module)."""


def hf_key(fqn: str, shape: ModelShape) -> str:
    """transformers' name of the parameter ``fqn`` (``layers.3.attention.wq.weight``).

    A tied head has no tensor of its own in a Hugging Face folder: it reads the embedding.
    """
    fqn = fqn.removeprefix("module.")  # DistributedDataParallel's wrapper
    if fqn == "tok_embeddings.weight" or (fqn == "output.weight" and shape.tie_embeddings):
        return "model.embed_tokens.weight"
    if fqn == "output.weight":
        return "lm_head.weight"
    if fqn == "norm.weight":
        return "model.norm.weight"
    _, index, rest = fqn.split(".", 2)
    module, _, leaf = rest.rpartition(".")
    if module.startswith("moe."):
        return f"model.layers.{index}.{moe_names(shape)[0]}.{_MOE[module[4:]]}.{leaf}"
    return f"model.layers.{index}.{_BLOCK[module]}.{leaf}"


def hf_entries(fqn: str, tensor: torch.Tensor, shape: ModelShape) -> list[tuple[str, Any]]:
    """transformers' names and tensors of parameter ``fqn``: one, or for a MoE layer's stacked
    experts (``layers.3.moe.experts.w1``) one 2-D view per expert this rank holds, named by
    its global index (expert parallelism holds a contiguous run of them)."""
    fqn = fqn.removeprefix("module.")
    if ".moe.experts." not in fqn:
        return [(hf_key(fqn, shape), tensor)]
    _, index, rest = fqn.split(".", 2)
    which = int(rest.rpartition(".")[2][1:])  # w1, w2, w3
    module, *pattern = moe_names(shape)
    first, local = 0, tensor
    if isinstance(tensor, DTensor):
        _, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements
        )
        first, local = offset[0], tensor.to_local()
    name = f"model.layers.{index}.{module}.{pattern[which - 1]}.weight"
    return [(name.format(first + j), local[j]) for j in range(local.shape[0])]


def hf_state(
    parts: Iterable[nn.Module], shape: ModelShape, with_tied_head: bool = True
) -> dict[str, Any]:
    """{transformers name: this rank's parameter (plain tensor or DTensor shard)}.

    ``with_tied_head`` False leaves out a tied head whose stage lacks the embedding, so a save
    writes the shared tensor once.
    """
    state: dict[str, Any] = {}
    for part in parts:
        names = {name.removeprefix("module.") for name, _ in part.named_parameters()}
        for name, param in part.named_parameters():
            tied_copy = name.endswith("output.weight") and shape.tie_embeddings
            if tied_copy and not with_tied_head and "tok_embeddings.weight" not in names:
                continue
            for key, tensor in hf_entries(name, param.detach(), shape):
                state.setdefault(key, tensor)
    return state


class SafetensorsSource:
    """A :class:`meshrun_trainer.models.materialize.WeightSource`: the folder's safetensors straight
    into each rank's freshly allocated shards (no random initialisation first).

    DCP plans the read from the targets: a DTensor target asks only for the slice its shard
    covers, which ``HuggingFaceStorageReader`` reads from the file (safetensors slicing), so no
    rank reads the whole model. A tied head reads the embedding's tensor.
    """

    def __init__(self, folder: str | Path, shape: ModelShape) -> None:
        self.folder, self.shape = Path(folder), shape

    def fill(self, targets: dict[str, torch.Tensor]) -> None:
        state = {
            key: tensor
            for name, target in targets.items()
            for key, tensor in hf_entries(name, target.detach(), self.shape)
        }
        dcp_load(state, storage_reader=HuggingFaceStorageReader(str(self.folder)))


def hf_config(shape: ModelShape, source: dict[str, Any] | None, dtype: str) -> dict[str, Any]:
    """config.json for the exported folder: the source's, or one describing ``shape``."""
    if source is not None:
        return {**source, "dtype": dtype}
    scaling = shape.rope_scaling
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    if scaling is not None:
        rope |= {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position,
        }
    config = {
        "architectures": [SUPPORTED[shape.architecture]],
        "model_type": shape.architecture,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn_hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.seq_len,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_theta,
        "rope_parameters": rope,
        "rope_scaling": rope if scaling is not None else None,
        "tie_word_embeddings": shape.tie_embeddings,
        "attention_bias": shape.output_bias,
        "hidden_act": "silu",
        "dtype": dtype,
    }
    if shape.moe is not None:
        # A mixture of experts not read from a folder is written as Mixtral (its names are
        # moe_names'; meshrun.rules.moe admits only what Mixtral describes).
        config |= {
            "architectures": [SUPPORTED["mixtral"]],
            "model_type": "mixtral",
            "intermediate_size": shape.moe.expert_ffn_hidden,
            "num_local_experts": shape.moe.experts,
            "num_experts_per_tok": shape.moe.experts_per_token,
            "router_aux_loss_coef": shape.moe.aux_loss_coefficient,
        }
    return config


def _publish(tmp: Path, final: Path) -> None:
    """Put the finished ``tmp`` at ``final``, replacing an older export only once it is whole."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def export(
    parts: Iterable[nn.Module],
    folder: str | Path,
    shape: ModelShape,
    source: Path | None = None,
    dtype: str = "float32",
) -> Path:
    """Write the model as a Hugging Face folder at ``folder``; collective, every rank calls it.

    ``source``: the Hugging Face folder the model came from (its config.json and tokenizer files
    are copied). Until the last step the files live in a hidden sibling ``.NAME.partial``: a
    crash never leaves a folder at ``folder`` that looks complete.
    """
    final = Path(folder)
    tmp = final.with_name(f".{final.name}.partial")
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if dist.is_initialized():
        dist.barrier()
    torch_dtype = getattr(torch, dtype)
    state = {k: v.to(torch_dtype) for k, v in hf_state(parts, shape, with_tied_head=False).items()}
    writer = HuggingFaceStorageWriter(str(tmp), save_distributed=True, enable_consolidation=True)
    dcp_save(state, storage_writer=writer)
    if rank == 0:
        shutil.rmtree(tmp / "sharded", ignore_errors=True)
        config = None
        if source is not None:
            config = json.loads(read_text_bounded(source / "config.json", FIELD))
            for name in TOKENIZER_FILES:
                try:
                    data = side_file(source, name)
                except SpecError as error:
                    # The weights are the export; a side file it may not publish is said, not
                    # fatal at the end of a run.
                    print(f"export: {error}", file=sys.stderr, flush=True)
                    continue
                if data is not None:
                    (tmp / name).write_bytes(data)
        text = json.dumps(hf_config(shape, config, dtype), indent=2) + "\n"
        (tmp / "config.json").write_text(text, encoding="utf-8")
        _publish(tmp, final)
    if dist.is_initialized():
        dist.barrier()
    return final
