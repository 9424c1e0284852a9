"""Llama family: Llama 2/3 (llama3 RoPE scaling), SmolLM/SmolLM2, Mistral (sliding window).

``LlamaForCausalLM`` is also the decoder every other family builds on: a family file
(gemma.py, phi3.py, ...) overrides the hooks its paper changes (its layers, its norm, how its
checkpoint names its tensors) and keeps the rest."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.models.layers import DecoderLayer, RMSNorm, RotaryEmbedding
from radixlm.runtime.models.moe import SparseMoE
from radixlm.runtime.models.registry import register_model

# HF checkpoint name fragment -> (our parameter fragment, shard index in the fused weight)
_STACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# NOTE: one expert's tensor of a MoE layer, once renamed (``renames``) to the Qwen-MoE names
_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


@register_model("LlamaForCausalLM", "MistralForCausalLM")
class LlamaForCausalLM(nn.Module):
    # NOTE: the compiled CPU decode steps (aot_graphs) know this plain decoder only
    aot_ready = True
    stacked = _STACKED  # checkpoint fragments fused into one of our parameters
    renames: tuple[tuple[str, str], ...] = ()  # checkpoint fragment -> ours, before the above
    unit_offset_norms = False  # Gemma's ``(1 + w)`` RMSNorm

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # NOTE: no random init (the loader fills every weight); on "meta", the init's normal_
        # would import torch's compiler (~170 MB resident)
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=nn.Parameter(torch.empty(shape)))
        self.layers = nn.ModuleList(self.layer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, self.unit_offset_norms)
        self.rotary = RotaryEmbedding(config)
        # NOTE: Gemma 3's sliding layers rotate with their own base and no frequency scaling
        local = config.rope_local_theta
        self.local_rotary = RotaryEmbedding(config, local, scaled=False) if local else None
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def layer(self, config: ModelConfig, i: int) -> nn.Module:
        """Decoder layer ``i``: pre-norm, with the dense or the sparse MLP."""
        return DecoderLayer(config, i, mlp=self.mlp(config, i))

    def mlp(self, config: ModelConfig, i: int) -> nn.Module | None:
        """Layer ``i``'s MLP: the experts where the config makes it sparse, else None (dense)."""
        sparse = config.num_experts and (not config.moe_layers or config.moe_layers[i])
        return SparseMoE(config) if sparse else None

    def tie_weights(self) -> None:
        """The head reads the embedding's weight when the config ties them (again after
        ``to_empty``, which gives every parameter its own storage)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        m = self.config.embedding_multiplier  # NOTE: Granite
        return x if m == 1.0 else x * m

    def forward(self, batch: ForwardBatch, backend) -> torch.Tensor:
        """Return logits ``[len(batch.logits_indices), vocab]`` in float32."""
        x = self.embed(batch.input_ids)
        tables = {"global": self.rotary.cos_sin(batch.positions, x.dtype)}
        if self.local_rotary is not None:
            tables["local"] = self.local_rotary.cos_sin(batch.positions, x.dtype)
        for layer in self.layers:
            x = layer(x, tables.get(layer.self_attn.rope), batch, backend)
        if batch.keep_hidden:  # NOTE: embedding requests pool them (norm is per row)
            batch.hidden = self.norm(x).float()
            x = batch.hidden[batch.logits_indices].to(x.dtype)
        else:
            x = self.norm(x[batch.logits_indices])
        logits = self.lm_head(x).float()
        c = self.config
        if c.logits_scaling != 1.0:  # NOTE: Granite
            logits = logits / c.logits_scaling
        if c.final_softcap:  # NOTE: Gemma 2
            logits = torch.tanh(logits / c.final_softcap) * c.final_softcap
        return logits

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        on_loaded: Callable[[nn.Module, str], None] | None = None,
    ) -> None:
        """Copy Hugging Face-named tensors into this model, fusing q/k/v, gate/up and the
        experts' tensors. ``on_loaded(self, name)`` runs as soon as parameter ``name`` has all
        its shards (it may replace the parameter's module: this method keeps no reference to it
        after the call)."""
        params = dict(self.named_parameters())
        shards_left = {name: self._shard_count(name) for name in params}
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb" in name or (
                name == "lm_head.weight" and self.config.tie_word_embeddings
            ):
                continue
            for frag, ours in self.renames:
                name = name.replace(frag, ours)
            name, view = self._target(name)
            if name not in params:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}"
                )
            self._copy(params[name], tensor, view, name)
            # NOTE: a tensor that fills its whole parameter (a fused checkpoint) ends it
            shards_left[name] = 0 if view is None else shards_left[name] - 1
            if shards_left[name] == 0 and on_loaded is not None:
                del params[name]
                on_loaded(self, name)
        missing = sorted(name for name, left in shards_left.items() if left > 0)
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:8]}")

    def _shard_count(self, name: str) -> int:
        """How many checkpoint tensors fill our parameter ``name`` (3 for q/k/v, 2 for gate/up,
        one per expert and projection for the stacked experts)."""
        experts = self.config.num_experts
        if name.endswith("experts.gate_up_proj"):
            return 2 * experts
        if name.endswith("experts.down_proj"):
            return experts
        return sum(f".{fused}." in name for fused, _ in self.stacked.values()) or 1

    def _target(self, name: str) -> tuple[str, Callable[[torch.Tensor], torch.Tensor] | None]:
        """Our parameter for checkpoint tensor ``name`` and the part of it the tensor fills
        (None: all of it)."""
        expert = _EXPERT.match(name)
        if expert:
            prefix, e, proj = expert.group(1), int(expert.group(2)), expert.group(3)
            if proj == "down_proj":
                return f"{prefix}.down_proj", lambda data: data[e]
            half = 0 if proj == "gate_proj" else 1
            return f"{prefix}.gate_up_proj", lambda data: data[e].chunk(2)[half]
        for frag, (fused, shard) in self.stacked.items():
            if f".{frag}." in name:
                view = functools.partial(self._shard_view, fused=fused, shard=shard)
                return name.replace(frag, fused), view
        return name, None

    def _shard_view(self, data: torch.Tensor, fused: str, shard: int) -> torch.Tensor:
        """Shard ``shard`` of a fused q/k/v (3 shards) or gate/up (2 halves) weight."""
        c = self.config
        if fused == "qkv_proj":
            q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
            sizes = (q, kv, kv)
        else:
            sizes = (data.shape[0] // 2,) * 2
        start = sum(sizes[:shard])
        return data.narrow(0, start, sizes[shard])

    def _copy(self, param: nn.Parameter, tensor: torch.Tensor, view, name: str) -> None:
        with torch.no_grad():
            target = param.data if view is None else view(param.data)
            if target.shape != tensor.shape:
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(target.shape)}"
                )
            target.copy_(tensor)
