"""GGUF weights kept in their quantized blocks on CPU (``ServerArgs.quantization='gguf'``).

A Q4_K_M file dequantised at load takes ~4x its size in bfloat16 (~8x in float32); here every
projection, the embedding and the LM head keep the file's bytes and the C++ kernels
(``kernels/gguf_matmul.cpp``) decode them inside the matmul. A fused projection (q/k/v,
gate/up) is a list of segments of output rows, one per run of checkpoint tensors of one type:
Q4_K_M stores most ``attn_v`` and ``ffn_down`` as Q6_K beside Q4_K ones, so a layer's q/k/v
may be two segments. Tensors of a type without a kernel (or unquantized ones) become float
segments. :func:`attach` does the replacing from the file's tensor table before the float
weights load; ``gguf_weights`` then skips the tensors it took.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.loader import gguf_loader

logger = logging.getLogger(__name__)

# ggml types the kernels compute (ggml's ids, kernels/gguf_matmul.cpp)
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8,
                "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}  # fmt: skip
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


class Segment(nn.Module):
    """Output rows of one weight: ``raw [rows, row bytes]`` blocks of ggml type ``kind``, or a
    float ``weight`` (``kind`` None)."""

    def __init__(self, kind: str | None, data: torch.Tensor) -> None:
        super().__init__()
        self.kind = kind
        self.register_buffer("data", data, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind is None:
            return F.linear(x, self.data)
        return torch.ops.radixlm_cpu.gguf_matmul(x, self.data, KERNEL_TYPES[self.kind])


class GGUFLinear(nn.Module):
    """``nn.Linear`` over GGUF segments, concatenated along the output (bias as the layer's)."""

    def __init__(self, segments: list[Segment], in_features: int, bias: nn.Parameter | None):
        super().__init__()
        self.segments = nn.ModuleList(segments)
        self.in_features = in_features
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        outs = [segment(flat) for segment in self.segments]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


class GGUFEmbedding(nn.Module):
    """Embedding rows decoded from their blocks as they are looked up."""

    def __init__(self, segment: Segment, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.segment, self.dim, self.dtype = segment, dim, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.segment.data.index_select(0, ids.reshape(-1))
        if self.segment.kind is None:
            out = rows.to(self.dtype)
        else:
            kind = KERNEL_TYPES[self.segment.kind]
            out = torch.ops.radixlm_cpu.gguf_dequantize(rows, kind, self.dim, self.dtype)
        return out.reshape(*ids.shape, self.dim)


def worth_it(reader, dtype: torch.dtype) -> bool:
    """Whether ``quantization='auto'`` keeps this file's blocks: most decoder-layer matrices
    are of a kernel type, other than Q4_0/Q4_1 in bfloat16 (those have the int4 path,
    models/quant.py, which runs in bfloat16 only)."""
    kinds = [t.tensor_type.name for t in reader.tensors
             if t.name.startswith("blk.") and len(t.shape) == 2]  # fmt: skip
    int4_path = ("Q4_0", "Q4_1") if dtype == torch.bfloat16 else ()
    native = sum(k in KERNEL_TYPES and k not in int4_path for k in kinds)
    return bool(kinds) and 2 * native > len(kinds)


def attach(model: nn.Module, reader, dtype: torch.dtype) -> set[str]:
    """Replace ``model``'s projections, embedding and head by modules over the file's blocks;
    returns the GGUF tensor names taken (the float loader skips them). Sets
    ``model.aot_ready`` False: SmolLM2 Q4_K_M decoded 80-92 tok/s eager against 47-53 through
    the compiled CPU steps (which build for ~8 minutes), so these models run eagerly."""
    arch = gguf_loader.arch_of(reader)
    pieces: dict[str, dict[int, Segment]] = defaultdict(dict)
    taken: set[str] = set()
    for t in reader.tensors:
        if len(t.shape) != 2:
            continue
        name = gguf_loader.hf_name(reader, t.name).removeprefix("model.")
        for frag, ours in model.renames:
            name = name.replace(frag, ours)
        target, shard = _module_of(model, name)
        if target is None:
            continue
        pieces[target][shard] = _segment(reader, t, arch, name, model.config, dtype)
        taken.add(t.name)
        reader.release(t)
    for target, shards in pieces.items():
        _replace(model, target, [shards[i] for i in sorted(shards)], dtype)
    if model.config.tie_word_embeddings and "embed_tokens" in pieces:
        model.lm_head = GGUFLinear([model.embed_tokens.segment], model.config.hidden_size, None)
    model.aot_ready = False
    return taken


def _module_of(model: nn.Module, name: str) -> tuple[str | None, int]:
    """The module (path) and shard index checkpoint weight ``name`` fills, if it is one kept
    in blocks."""
    if not name.endswith(".weight"):
        return None, 0
    path = name.removesuffix(".weight")
    if path in ("embed_tokens", "lm_head"):
        return path, 0
    for frag, (fused, shard) in model.stacked.items():
        if path.endswith(f".{frag}"):
            path, index = path.replace(frag, fused), shard
            break
    else:
        index = 0
    return (path, index) if path.rsplit(".", 1)[-1] in PROJECTIONS else (None, 0)


def _segment(reader, t, arch: str, name: str, config, dtype: torch.dtype) -> Segment:
    """GGUF tensor ``t`` as a segment: its blocks (copied out of the read-only memory map), or
    a float weight in ``dtype`` for a type without a kernel."""
    kind = t.tensor_type.name
    rows = int(t.shape[1])
    if kind in KERNEL_TYPES:
        data = torch.from_numpy(np.array(t.data).reshape(rows, -1))
    else:
        if kind not in ("F32", "F16", "BF16"):
            logger.warning("%s: no kernel for %s; dequantised at load", t.name, kind)
        data = gguf_loader.dequantize(t, dtype).reshape(rows, int(t.shape[0]))
        kind = None
    if arch == "llama" and name.endswith("q_proj.weight"):
        data = gguf_loader.unpermute(data, config.num_heads)
    elif arch == "llama" and name.endswith("k_proj.weight"):
        data = gguf_loader.unpermute(data, config.num_kv_heads)
    return Segment(kind, data.contiguous())


def _replace(model: nn.Module, path: str, shards: list[Segment], dtype: torch.dtype) -> None:
    parent_path, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, child)
    if isinstance(old, nn.Embedding):
        (segment,) = shards
        setattr(parent, child, GGUFEmbedding(segment, old.embedding_dim, dtype))
        return
    merged: list[Segment] = []
    for segment in shards:  # NOTE: neighbouring shards of one type are one matmul
        if merged and merged[-1].kind == segment.kind:
            merged[-1] = Segment(segment.kind, torch.cat([merged[-1].data, segment.data]))
        else:
            merged.append(segment)
    setattr(parent, child, GGUFLinear(merged, old.in_features, old.bias))


def bytes_by_type(model: nn.Module) -> dict[str, int]:
    """Weight bytes per ggml type of the blocks, and per dtype of the float weights (float
    segments and parameters; a tied weight counted once)."""
    out: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    tensors = [(m.kind, m.data) for m in model.modules() if isinstance(m, Segment)]
    tensors += [(None, p) for p in model.parameters()]
    for kind, data in tensors:
        if data.data_ptr() not in seen:
            seen.add(data.data_ptr())
            out[kind or str(data.dtype).removeprefix("torch.")] += data.nbytes
    return dict(out)
