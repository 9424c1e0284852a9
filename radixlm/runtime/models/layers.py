"""Layers shared by the model families: RMSNorm, rotary embedding, gated MLP, attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.kernels import cpu_ops
from radixlm.runtime.config import ModelConfig
from radixlm.runtime.executor.forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: both compute in float32 and round once, as HF's upcast does; eager bf16 steps on
        # CPU take the C++ kernel once loaded (one op for torch's ~8), compiled ones fuse torch's
        weight = self.weight.to(x.dtype)
        if x.dtype == torch.bfloat16 and not x.is_cuda and cpu_ops.loaded():
            if not torch.compiler.is_compiling():
                return cpu_ops.rms_norm(x, weight, self.eps)
        return F.rms_norm(x, x.shape[-1:], weight, self.eps)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with Llama 3 frequency scaling when the config asks for it."""
    dim = config.head_dim
    # NOTE: on the host whatever device the model is built on (models are built on "meta")
    steps = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu")
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    scaling = config.rope_scaling_dict
    if not scaling:
        return inv_freq.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        return _llama3_scale(inv_freq, scaling).float()
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float()
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: llama3, linear)")


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

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.inv_freq = rope_inv_freq(config)
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
        return emb.cos().to(device, dtype), emb.sin().to(device, dtype)

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
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Attention(nn.Module):
    """Fused QKV projection, optional q/k RMSNorm (Qwen3), rotary, attention over the KV pool."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
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
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos_sin: tuple, batch: ForwardBatch, backend
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        out = backend.forward(q, k, v, self.layer_id, batch)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_id)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(
        self, x: torch.Tensor, cos_sin: tuple, batch: ForwardBatch, backend
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))
