"""Llama family: Llama 2/3 (llama3 RoPE scaling), SmolLM/SmolLM2, Mistral (no sliding window)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.layers import DecoderLayer, RMSNorm, RotaryEmbedding
from radixlm.runtime.models.registry import register_model

# HF checkpoint name fragment -> (our parameter fragment, shard index in the fused weight)
_STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@register_model("LlamaForCausalLM", "MistralForCausalLM")
class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # NOTE: no random init (the loader fills every weight); on "meta", the init's normal_
        # would import torch's compiler (~170 MB resident)
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=nn.Parameter(torch.empty(shape)))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """The head reads the embedding's weight when the config ties them (again after
        ``to_empty``, which gives every parameter its own storage)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, batch: ForwardBatch, backend) -> torch.Tensor:
        """Return logits ``[len(batch.logits_indices), vocab]`` in float32."""
        x = self.embed_tokens(batch.input_ids)
        cos_sin = self.rotary.cos_sin(batch.positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos_sin, batch, backend)
        x = self.norm(x[batch.logits_indices])
        return self.lm_head(x).float()

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        on_loaded: Callable[[nn.Module, str], None] | None = None,
    ) -> None:
        """Copy Hugging Face-named tensors into this model, fusing q/k/v and gate/up.
        ``on_loaded(self, name)`` runs as soon as parameter ``name`` has all its shards (it may
        replace the parameter's module: this method keeps no reference to it after the call)."""
        params = dict(self.named_parameters())
        shards_left = {name: _shard_count(name) for name in params}
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb" in name or (
                name == "lm_head.weight" and self.config.tie_word_embeddings
            ):
                continue
            name, shard = _fused_name(name)
            if name not in params:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}"
                )
            self._copy(params[name], tensor, shard, name)
            shards_left[name] -= 1
            if shards_left[name] == 0 and on_loaded is not None:
                del params[name]
                on_loaded(self, name)
        missing = sorted(name for name, left in shards_left.items() if left > 0)
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}")

    def _copy(
        self, param: nn.Parameter, tensor: torch.Tensor, shard: int | None, name: str
    ) -> None:
        with torch.no_grad():
            target = param.data if shard is None else _shard_view(param.data, name, shard, self)
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(target.shape)}"
                )
            target.copy_(tensor)


def _shard_count(name: str) -> int:
    """How many checkpoint tensors fill our parameter ``name`` (3 for q/k/v, 2 for gate/up)."""
    return sum(f".{fused}." in name for fused, _ in _STACKED.values()) or 1


def _fused_name(name: str) -> tuple[str, int | None]:
    for frag, (fused, shard) in _STACKED.items():
        if f".{frag}." in name:
            return name.replace(frag, fused), shard
    return name, None


def _shard_view(data: torch.Tensor, name: str, shard: int, model: LlamaForCausalLM) -> torch.Tensor:
    c = model.config
    if "qkv_proj" in name:
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        sizes = (q, kv, kv)
    else:
        sizes = (c.intermediate_size, c.intermediate_size)
    start = sum(sizes[:shard])
    return data.narrow(0, start, sizes[shard])
