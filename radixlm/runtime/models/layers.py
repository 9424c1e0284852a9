"""Layers shared by the model families: RMSNorm, rotary embedding, gated MLP, attention, and the
pre-norm decoder layer; each family (llama.py, gemma.py, ...) composes them as its paper does."""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_ops
from radixlm.runtime.config import ModelConfig
from radixlm.runtime.executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


CPU_NORM_DTYPES = (torch.bfloat16, torch.float32)  # the C++ rms_norm's


class RMSNorm(nn.Module):
    """``unit_offset``: the weight is stored as ``w - 1`` and applied as ``1 + w`` in float32
    before rounding (Gemma)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.unit_offset:
            weight = self.weight.float() + 1.0
            return F.rms_norm(x.float(), x.shape[-1:], weight, self.eps).to(x.dtype)
        # NOTE: both compute in float32 and round once, as HF's upcast does; eager steps on CPU
        # take the C++ kernel once loaded (one op for torch's ~8: a SmolLM2 row, float32,
        # 93 us -> ~5), compiled ones fuse torch's
        weight = self.weight.to(x.dtype)
        if x.dtype in CPU_NORM_DTYPES and not x.is_cuda and cpu_ops.loaded():
            if not torch.compiler.is_compiling():
                return cpu_ops.rms_norm(x, weight, self.eps)
        return F.rms_norm(x, x.shape[-1:], weight, self.eps)


ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn", "longrope")


def rope_inv_freq(
    config: ModelConfig, theta: float | None = None, scaled: bool = True
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of the rotary dimensions and the factor cos/sin are scaled by, with
    the config's frequency scaling (``scaled``; a Gemma 3 sliding layer's local base has none)."""
    dim = config.rotary_dim or config.head_dim
    base = config.rope_theta if theta is None else theta
    # NOTE: on the host whatever device the model is built on (models are built on "meta")
    steps = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / (base ** (steps / dim))
    scaling = config.rope_scaling_dict if scaled else None
    if not scaling:
        return inv_freq.float(), 1.0
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        return _llama3_scale(inv_freq, scaling).float(), 1.0
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float(), 1.0
    if kind == "dynamic":
        # NOTE: dynamic NTK changes the base only for sequences past the original context (HF:
        # for the whole batch once its longest is); within it, the plain frequencies are exact
        logger.warning("rope_scaling 'dynamic': positions past the original context use the "
                       "unscaled frequencies (Hugging Face rescales the base there)")  # fmt: skip
        return inv_freq.float(), 1.0
    if kind == "yarn":
        return _yarn(inv_freq, scaling, dim, base, config.context_length)
    if kind == "longrope":
        return _longrope(inv_freq, scaling, config.context_length)
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
    )


def _yarn(inv_freq, s: dict, dim: int, base: float, context: int) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): interpolate the low frequencies by ``factor``, keep the high
    ones, ramp between the dimensions that rotate ``beta_slow`` and ``beta_fast`` times over the
    original context; cos/sin scaled by ``0.1 ln(factor) + 1`` (or the given factor)."""
    old = s["original_max_position_embeddings"]
    factor = s.get("factor") or context / old

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def dim_of(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(s.get("beta_fast") or 32), dim_of(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    keep = 1 - ramp  # NOTE: 1 = the original (extrapolated) frequency
    out = inv_freq / factor * (1 - keep) + inv_freq * keep
    return out.float(), float(attention)


def _longrope(inv_freq, s: dict, context: int) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): each frequency divided by its own factor, ``short_factor`` within the
    original context. NOTE: positions past it would take ``long_factor`` in Hugging Face (for a
    whole sequence, once it is longer); here the short factors serve every position, so output
    past the original context differs from HF's."""
    old = s["original_max_position_embeddings"]
    factor = s.get("factor") or (s.get("max_position_embeddings") or context) / old
    attention = s.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(old))
    short = torch.tensor(s["short_factor"], dtype=torch.float64)
    return (inv_freq / short).float(), float(attention)


def _llama3_scale(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    mid = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(is_mid, mid, out)


class RotaryEmbedding(nn.Module):
    """Neox-style rotary embedding (rotate halves), as Hugging Face Llama and Qwen apply it.

    The cos/sin table is computed in float32 from float32 frequencies (kept out of the module's
    buffers, so ``model.to(bfloat16)`` cannot round them) and cast once. ``build`` sizes it for
    the context length up front, so a forward pass only indexes it: no size check, no host sync
    (what a CUDA graph needs)."""

    def __init__(
        self, config: ModelConfig, theta: float | None = None, scaled: bool = True
    ) -> None:
        super().__init__()
        self.inv_freq, self.attention_factor = rope_inv_freq(config, theta, scaled)
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._sized = False

    def build(self, num_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        """Fix the table at ``num_positions`` rows; positions beyond it are the caller's bug."""
        self._table = self._make(num_positions, dtype, device)
        self._sized = True

    def _make(self, n: int, dtype: torch.dtype, device: torch.device) -> tuple:
        positions = torch.arange(n, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, self.inv_freq.to(device))
        emb = torch.cat([freqs, freqs], dim=-1)
        f = self.attention_factor
        return (emb.cos() * f).to(device, dtype), (emb.sin() * f).to(device, dtype)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._sized:  # NOTE: a model used without build() (tests) grows on demand.
            need = max(int(positions.max()) + 1 if positions.numel() else 1, 4096)
            t = self._table
            if (t is None or t[0].shape[0] < need or t[0].dtype != dtype
                    or t[0].device != positions.device):  # fmt: skip
                self._table = self._make(need, dtype, positions.device)
        cos, sin = self._table
        return cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate halves of the first ``cos.shape[-1]`` dimensions (all, unless partial rotary)."""
    dim = cos.shape[-1]
    if dim < x.shape[-1]:
        return torch.cat([apply_rotary(x[..., :dim], cos, sin), x[..., dim:]], dim=-1)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: SwiGLU with silu, GeGLU with gelu (Gemma)."""

    def __init__(self, hidden: int, intermediate: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)


class Attention(nn.Module):
    """Fused QKV projection, optional q/k RMSNorm, rotary, attention over the KV pool.

    ``qk_norm``: "head" normalises each head's q and k (Qwen3, Gemma 3), "full" the whole
    projected q and k (OLMo 2, OLMoE). ``rope``: which of the model's rotary tables the layer
    applies ("global", "local" for a Gemma 3 sliding layer, None for SmolLM3's NoPE layers).
    The backend knows the layer's window, scale and soft cap by ``layer_id``."""

    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        qk_norm: str | None = None,
        unit_offset: bool = False,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(
            config.hidden_size, q_size + 2 * kv_size, bias=config.attention_bias
        )
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)
        qk_norm = qk_norm or ("head" if config.qk_norm else None)
        self.qk_norm = qk_norm
        q_dim, k_dim = (self.head_dim, self.head_dim) if qk_norm == "head" else (q_size, kv_size)
        eps = config.rms_norm_eps
        self.q_norm = RMSNorm(q_dim, eps, unit_offset) if qk_norm else None
        self.k_norm = RMSNorm(k_dim, eps, unit_offset) if qk_norm else None
        self.clip_qkv = config.clip_qkv
        local = config.rope_local_theta and config.window_of[layer_id]
        uses_rope = not config.rope_layers or config.rope_layers[layer_id]
        self.rope = None if not uses_rope else "local" if local else "global"

    def forward(
        self, x: torch.Tensor, cos_sin: tuple | None, batch: ForwardBatch, backend
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        if self.qk_norm == "full":
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip_qkv:  # NOTE: OLMoE
            c = self.clip_qkv
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        if cos_sin is not None:
            q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        out = backend.forward(q, k, v, self.layer_id, batch)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


# NOTE: where a block's norms sit, by their checkpoint names: (before attention, after it,
# before the MLP, after it); None = no norm there
NORM_LAYOUTS = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),  # Llama and most
    "sandwich": ("input_layernorm", "post_attention_layernorm",  # Gemma 2 and 3
                 "pre_feedforward_layernorm", "post_feedforward_layernorm"),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),  # OLMo 2
}  # fmt: skip


class DecoderLayer(nn.Module):
    """``x + m * attn(norm(x))``, then ``x + m * mlp(norm(x))`` (``m`` the residual multiplier,
    1 but for Granite), with the norms where ``norms`` (a NORM_LAYOUTS key) puts them; ``mlp``
    defaults to the dense gated MLP."""

    def __init__(
        self, config: ModelConfig, layer_id: int, attn: nn.Module | None = None,
        mlp: nn.Module | None = None, norms: str = "pre", unit_offset: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        self.norm_names = NORM_LAYOUTS[norms]
        for name in self.norm_names:
            if name is not None:
                setattr(self, name, RMSNorm(config.hidden_size, config.rms_norm_eps, unit_offset))
        self.self_attn = attn or Attention(config, layer_id)
        self.mlp = mlp or GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
        self.residual_multiplier = config.residual_multiplier

    def _norm(self, which: int, x: torch.Tensor) -> torch.Tensor:
        name = self.norm_names[which]
        return x if name is None else getattr(self, name)(x)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple | None, batch: ForwardBatch, backend
    ) -> torch.Tensor:
        m = self.residual_multiplier
        attn = self._norm(1, self.self_attn(self._norm(0, x), cos_sin, batch, backend))
        x = x + (attn if m == 1.0 else attn * m)
        mlp = self._norm(3, self.mlp(self._norm(2, x)))
        return x + (mlp if m == 1.0 else mlp * m)
