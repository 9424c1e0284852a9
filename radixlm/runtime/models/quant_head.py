"""Weight-only int8 for the LM head of CPU decode steps.

The head is the largest matrix a small model reads per token (SmolLM2-135M: vocab 49152 x 576,
56 MB in bf16, about half the bytes of a decode step once the layers run int4). A decode step
multiplies it by one row per request: its time is the time to read the weight.
:class:`Int8DecodeHead` keeps an int8 copy (symmetric, one bf16 scale per output row and group of
``group_size(K)`` inputs) and uses it when the head gets at most ``MAX_INT8_HEAD_ROWS`` rows;
more rows (prompt logprobs, large decode batches) use the bf16 weight, reordered once into
oneDNN's blocked layout (``quant.onednn_weight``): 32 rows of SmolLM2's head took 6.2 ms
against 9.8 through ``F.linear``, which reorders the plain weight at every call (2 threads).

Kernel: ``aten._weight_int8pack_mm`` (bf16 activations, int8 weight, a scale per output row),
once per group, summed in float32. Splitting K is also what makes it fast on this CPU: a
one-row step of the 49152 x 576 head takes 2.3 ms as three calls of 192 inputs, against 4.4 ms
as one call and 8 ms in bf16 (AMD EPYC with AVX512, 2 threads, cold cache, best of 40). The
kernel reads the codes once per 4 rows, so past 4 rows it gains little over bf16 (1 thread:
4 rows 4.6 ms against 8.6; 5 rows 7.4 against 8.8; 8 rows 8.9 against 9.7), but up to 8 rows
(the int4 layers' limit) it keeps a speculative verify step's logits computed as a decode
step's are. (``torch._int_mm`` needs int8 activations, which cost too much
accuracy; dequantising chunks on the fly is slower than bf16.)

Accuracy (SmolLM2-135M, 256 real decode states): the int8 logits differ from float32 ones by at
most 0.24 of the row's logit standard deviation (the bf16 head: 0.05); the greedy token agrees
with float32's on 96.5% of the states, the bf16 head's on 97.3% (its bf16 output makes ties).

Memory: the int8 copy adds 1 byte per head weight (SmolLM2: 28 MB); the bf16 weight stays, in
oneDNN's layout for larger steps and, when tied, also plain as the embedding (SmolLM2: +56 MB;
``low_memory`` holds the int8 copy alone).
"""

from __future__ import annotations

import logging
import platform

import torch
from torch import nn

from radixlm.runtime.models.onednn import OneDnnWeight

logger = logging.getLogger(__name__)

MAX_INT8_HEAD_ROWS = 8
MAX_GROUP = 256
# NOTE: the AVX512 kernel loads 16 inputs at a time with no tail loop (other sizes read out of
# bounds); multiples of 32 also suit the AVX2 and NEON kernels.
GROUP_ALIGN = 32
# NOTE: weights quantised at a time: float32 temporaries of ~0.5 MB, which glibc reuses on its
# heap; whole-tensor ones (a fused gate/up: ~15 of 7 MB) piled up there between the loader's
# trims (SmolLM2 in low_memory: the load peaked at 527-637 MB, 483-487 in pieces)
QUANTIZE_WEIGHTS = 1 << 17


def int8_head_available() -> bool:
    """The kernel exists and is vectorised here (x86 AVX2/AVX512 or ARM NEON)."""
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return False
    capability = torch.backends.cpu.get_cpu_capability()
    return capability in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


def group_size(k: int) -> int | None:
    """The largest multiple of 32 up to ``MAX_GROUP`` that divides ``k``; None if there is none."""
    sizes = [g for g in range(GROUP_ALIGN, MAX_GROUP + 1, GROUP_ALIGN) if k % g == 0]
    return sizes[-1] if sizes else None


def quantize_int8(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` -> (codes ``[K / group, N, group]`` int8, scales ``[K / group, N]`` in
    the weight's dtype) with ``w = q * scale``, ``q`` in -127..127."""
    n, k = weight.shape
    codes = torch.empty(k // group, n, group, dtype=torch.int8, device=weight.device)
    scales = torch.empty(k // group, n, dtype=weight.dtype, device=weight.device)
    step = max(1, QUANTIZE_WEIGHTS // k)  # NOTE: a float32 copy of a large head: gigabytes
    for start in range(0, n, step):
        rows = slice(start, start + step)
        codes[:, rows], scales[:, rows] = _quantize_rows(weight.detach()[rows], group)
    return codes, scales


def _quantize_rows(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    groups = weight.float().reshape(n, k // group, group).transpose(0, 1)
    amax = groups.abs().amax(-1)
    # NOTE: codes are fitted to the scale as the kernel will read it (rounded to bf16).
    scale = torch.where(amax > 0, amax / 127, 1.0).to(weight.dtype)
    codes = (groups / scale.float()[..., None]).round().clamp(-127, 127).to(torch.int8)
    return codes, scale


def int8_head_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ dequantised(codes).T`` -> ``[M, N]`` float32, one kernel call per group."""
    num_groups, _, group = codes.shape
    # NOTE: a fresh copy: the kernel's aligned loads need each group's rows 32-byte aligned.
    xg = x.reshape(x.shape[0], num_groups, group).transpose(0, 1)
    xg = xg.clone(memory_format=torch.contiguous_format)
    out = torch.ops.aten._weight_int8pack_mm(xg[0], codes[0], scales[0]).float()
    for i in range(1, num_groups):
        out.add_(torch.ops.aten._weight_int8pack_mm(xg[i], codes[i], scales[i]))
    return out


def ref_int8_head_mm(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Plain-torch twin of :func:`int8_head_mm`, in float32."""
    weight = codes.float() * scales.float()[..., None]  # [G, N, group]
    return x.float() @ weight.transpose(0, 1).reshape(weight.shape[1], -1).t()


class Int8DecodeHead(nn.Module, OneDnnWeight):
    """An ``nn.Linear`` head with an int8 copy of its weight for few rows (see module).

    Its int8 path returns float32 logits; the bf16 path returns the input's dtype."""

    def __init__(self, linear: nn.Linear, int8_only: bool = False) -> None:
        super().__init__()
        self.bias, self.int8_only = linear.bias, int8_only
        # NOTE: a tied embedding keeps its own reference to the plain weight
        self.hold_bf16(linear.weight, needed=not int8_only)
        group = group_size(linear.in_features)
        if group is None:
            raise ValueError(f"int8 head needs inputs in groups of {GROUP_ALIGN}")
        codes, scales = quantize_int8(linear.weight, group)
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scales", scales, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: the flag first: a graph exported for every row count gets no guard on rows
        few_rows = self.int8_only or x.shape[0] <= MAX_INT8_HEAD_ROWS
        if x.dim() == 2 and few_rows and x.dtype == self.scales.dtype:
            out = int8_head_mm(x, self.codes, self.scales)
            return out if self.bias is None else out + self.bias
        return self.bf16_linear(x, self.bias)


class Int8Embedding(nn.Module):
    """Token embeddings looked up in an int8 copy (:func:`quantize_int8`'s layout), each row
    dequantised as it is read; when weights are held once (the tied head's copy, if tied)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scales", scales, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        num_groups, _, group = self.codes.shape
        rows = self.codes[:, ids].float() * self.scales[:, ids, None].float()  # [G, T, group]
        return rows.transpose(0, 1).reshape(*ids.shape, num_groups * group).to(self.scales.dtype)


def apply_int8_head(model: nn.Module, weights_once: bool = False) -> bool:
    """Give ``model.lm_head`` an int8 copy for decode; False where the kernel or shape won't do.
    ``weights_once``: the copy replaces the bf16 head for every step and, if the embedding is
    tied to it, the embedding too (see ``int8_embedding`` for an untied one)."""
    head = getattr(model, "lm_head", None)
    if (type(head) is not nn.Linear or head.weight.dtype != torch.bfloat16
            or group_size(head.in_features) is None or not int8_head_available()):  # fmt: skip
        return False
    tied = _tied(model)
    model.lm_head = Int8DecodeHead(head, int8_only=weights_once)
    if weights_once and tied:
        model.embed_tokens = Int8Embedding(model.lm_head.codes, model.lm_head.scales)
    rows = "every step" if weights_once else f"steps of <= {MAX_INT8_HEAD_ROWS} logit rows"
    logger.info("int8 copy of the LM head for %s (+%.0f MB)",
                rows, model.lm_head.codes.numel() / 2**20)  # fmt: skip
    return True


def int8_as_loaded(model: nn.Module, name: str) -> None:
    """The loader's hook for weights held once (see ``quant.weights_once_as_loaded``): the head,
    and the embedding, become int8 as soon as their weight is filled (the embedding is a
    GGUF's first tensor: its bf16 copy never lives beside the layers)."""
    if name == "lm_head.weight" or (name == "embed_tokens.weight" and _tied(model)):
        apply_int8_head(model, weights_once=True)
    elif name == "embed_tokens.weight":
        int8_embedding(model)


def _tied(model: nn.Module) -> bool:
    embed, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    return type(embed) is nn.Embedding and type(head) is nn.Linear and embed.weight is head.weight


def int8_embedding(model: nn.Module) -> None:
    """An untied bf16 embedding becomes an ``Int8Embedding`` of its own codes (call it once the
    embedding is loaded: a checkpoint may hold the head first)."""
    embed = model.embed_tokens
    if type(embed) is not nn.Embedding or embed.weight.dtype != torch.bfloat16:
        return
    group = group_size(embed.embedding_dim)
    if group is not None:
        model.embed_tokens = Int8Embedding(*quantize_int8(embed.weight, group))
