"""Frozen configuration objects: the model's shape and the engine's options."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a decoder-only transformer, independent of where its weights came from."""

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    context_length: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    # NOTE: what the attention backend needs per layer. A sliding layer's query at position p
    # sees keys p - W < k <= p (HF's convention); () = every layer attends to all its keys.
    layer_windows: tuple[int | None, ...] = ()
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # logits likewise
    # NOTE: the rest is read by the model families (models/*.py) as the paper defines them
    hidden_act: str = "silu"
    rotary_dim: int | None = None  # None: head_dim (partial rotary otherwise)
    rope_local_theta: float | None = None  # sliding layers' RoPE base (Gemma 3)
    rope_layers: tuple[bool, ...] = ()  # which layers apply RoPE (SmolLM3); () = all
    embedding_multiplier: float = 1.0  # Granite
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0  # logits are divided by it
    num_experts: int = 0  # mixture of experts: 0 = dense MLP in every layer
    experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True  # the top-k routing weights renormalised to sum to 1
    moe_layers: tuple[bool, ...] = ()  # which layers are MoE; () = all (when num_experts)
    clip_qkv: float | None = None  # q, k and v clamped to +-clip (OLMoE)

    @property
    def window_of(self) -> list[int | None]:
        """Each layer's sliding window (None = full attention)."""
        return list(self.layer_windows) or [None] * self.num_layers

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dictionary."""
        archs = d.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry")
        heads = d["num_attention_heads"]
        eos = d.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        local_theta = d.get("rope_local_base_freq")
        if "full_attention" in rope:  # NOTE: per layer type (Gemma 3 in transformers 5)
            local_theta = rope.get("sliding_attention", {}).get("rope_theta", local_theta)
            rope = rope["full_attention"]
        theta = d.get("rope_theta") or rope.get("rope_theta", 10000.0)
        scaling = None if rope.get("rope_type", rope.get("type")) in (None, "default") else rope
        if scaling is not None and "original_max_position_embeddings" in d:
            scaling = {"original_max_position_embeddings": d["original_max_position_embeddings"],
                       "max_position_embeddings": d.get("max_position_embeddings"),
                       **scaling}  # fmt: skip
        arch = archs[0]
        head_dim = d.get("head_dim") or d["hidden_size"] // heads
        partial = d.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
        experts = d.get("num_local_experts") or d.get("num_experts") or 0
        step = d.get("decoder_sparse_step") or 1
        dense_layers = set(d.get("mlp_only_layers") or [])
        return cls(
            architecture=arch,
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab_size=d["vocab_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_scaling=_freeze(scaling),
            context_length=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=arch.startswith("Qwen2") or d.get("attention_bias", False),
            qk_norm=arch.startswith("Qwen3"),
            eos_token_ids=eos_ids,
            bos_token_id=d.get("bos_token_id"),
            layer_windows=_layer_windows(d),
            attention_scale=_attention_scale(d),
            attn_softcap=d.get("attn_logit_softcapping"),
            final_softcap=d.get("final_logit_softcapping"),
            hidden_act=d.get("hidden_activation") or d.get("hidden_act") or "silu",
            rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
            rope_local_theta=float(local_theta) if local_theta else None,
            rope_layers=tuple(bool(x) for x in d.get("no_rope_layers") or ()),
            embedding_multiplier=float(d.get("embedding_multiplier", 1.0)),
            residual_multiplier=float(d.get("residual_multiplier", 1.0)),
            logits_scaling=float(d.get("logits_scaling", 1.0)),
            num_experts=experts,
            experts_per_tok=d.get("num_experts_per_tok") or 0,
            moe_intermediate_size=d.get("moe_intermediate_size") or d["intermediate_size"],
            shared_expert_intermediate_size=d.get("shared_expert_intermediate_size") or 0,
            # NOTE: Mixtral renormalises (no flag); Qwen-MoE and OLMoE say whether they do
            norm_topk_prob=d.get("norm_topk_prob", True),
            moe_layers=tuple(
                i not in dense_layers and (i + 1) % step == 0 for i in range(d["num_hidden_layers"])
            ) if experts else (),
            clip_qkv=d.get("clip_qkv"),
        )

    def with_overrides(self, **kw: Any) -> ModelConfig:
        return dataclasses.replace(self, **kw)


def _freeze(d: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    if not d:
        return None
    items = ((k, tuple(v) if isinstance(v, list) else v) for k, v in d.items())
    return tuple(sorted((k, v) for k, v in items if not isinstance(v, dict) and v is not None))


def _layer_windows(d: dict[str, Any]) -> tuple[int | None, ...]:
    """Each layer's sliding window, from ``layer_types`` where the config has them (Gemma 2/3,
    Qwen2, GPT-OSS), else ``sliding_window`` on every layer (Mistral, Mixtral, Phi-3)."""
    window = d.get("sliding_window")
    if not window or d.get("use_sliding_window") is False:
        return ()
    types = d.get("layer_types")
    if types is None:
        return (window,) * d["num_hidden_layers"]
    windows = tuple(window if t == "sliding_attention" else None for t in types)
    return windows if any(windows) else ()


def _attention_scale(d: dict[str, Any]) -> float | None:
    if d.get("query_pre_attn_scalar"):  # NOTE: Gemma
        return float(d["query_pre_attn_scalar"]) ** -0.5
    if d.get("attention_multiplier"):  # NOTE: Granite
        return float(d["attention_multiplier"])
    return None


SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random", "priority")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
LOAD_BALANCE_METHODS = ("cache_aware", "round_robin", "least_load")
QUANTIZATIONS = ("auto", "none", "int4", "gguf")
# NOTE: the registries (constrained/base.py, executor/attention/base.py) hold the same names;
# they are repeated here so that a bad flag is refused before any model or backend loads.
# xgrammar is optional (the grammars extra); choosing it without the package fails here.
GRAMMAR_BACKENDS = ("outlines", "llguidance", "xgrammar")
ATTENTION_BACKENDS = ("torch", "triton")
ATTENTION_ALIASES = {"torch_native": "torch"}  # NOTE: SGLang's name for its torch backend


@dataclass(frozen=True)
class ServerArgs:
    """Every option of the engine and server. Validated on construction, no I/O."""

    model_path: str | None = None
    tokenizer_path: str | None = None
    # NOTE: no tokenizer anywhere: prompts are input_ids, outputs are output_ids with text "".
    skip_tokenizer_init: bool = False
    load_format: str = "auto"
    # NOTE: int4 = an int4 copy of the layer weights for CPU steps of <= 8 tokens (bf16 for the
    # rest) and an int8 copy of the LM head for steps of <= 8 logit rows (models/quant_head.py);
    # gguf = a GGUF file's quantized tensors kept in their blocks on CPU, computed by the GGUF
    # kernels (models/gguf_quant.py); auto = int4 when a GGUF checkpoint is itself Q4_0/Q4_1
    # and the engine runs bf16 on CPU, gguf for the other quantized GGUF files on CPU (Q4_0/Q4_1
    # ones included when it runs float32).
    quantization: str = "auto"
    # NOTE: CPU, bf16: each weight held once, as the int4 copy of the layers and the int8 copy
    # of the head and tied embedding, used for every step (prefill included, ~2.5x slower
    # matmuls than bf16); its compiled decode steps are two graphs (executor/aot_graphs.py).
    low_memory: bool = False
    dtype: str = "auto"
    device: str = "auto"
    context_length: int | None = None
    # NOTE: SGLang's: config.json fields replaced before the model is built, as a JSON object
    json_model_override_args: str = "{}"
    # NOTE: SGLang's: an embedding server; generation requests are refused
    is_embedding: bool = False
    max_total_tokens: int | None = None
    mem_fraction_static: float = 0.85
    max_running_requests: int = 256
    max_queued_requests: int | None = None
    max_prefill_tokens: int = 8192
    chunked_prefill_size: int | None = 2048
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    page_size: int = 1
    attention_backend: str | None = None
    grammar_backend: str = "outlines"
    disable_jump_forward: bool = False
    # NOTE: compact JSON by default: fewer tokens, long forced runs for jump-forward (`{"name":"`),
    # and no whitespace for a small model to loop on. "[ ]?" allows a space after : and ,.
    constrained_json_whitespace_pattern: str = ""
    disable_cuda_graph: bool = False
    # NOTE: CPU decode steps run graphs compiled ahead of time by a child process and kept on
    # disk (executor/aot_graphs.py); RADIXLM_DISABLE_CPU_COMPILE=1 sets this default
    disable_cpu_compile: bool = field(
        default_factory=lambda: os.environ.get("RADIXLM_DISABLE_CPU_COMPILE", "") == "1"
    )
    # NOTE: report ready only once the compiled CPU steps are loaded (built first if missing)
    wait_cpu_graphs: bool = False
    cuda_graph_max_bs: int = 256  # decode batches up to this size replay captured graphs
    tp_size: int = 1
    dp_size: int = 1
    load_balance_method: str = "cache_aware"
    # torch threads of each computing process (scheduler, tensor-parallel ranks). None:
    # RADIXLM_NUM_THREADS, else OMP_NUM_THREADS, else the physical cores but one, shared (<= 8).
    num_threads: int | None = None
    random_seed: int = 0
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    # A file of API keys, one per line: "KEY TENANT" (TENANT defaults to the line number). Each
    # tenant's requests are salted with its name (cache_salt), so tenants never share KV.
    api_keys_file: str | None = None
    max_request_bytes: int = 8 * 1024 * 1024  # larger bodies get 413 before they are parsed
    served_model_name: str | None = None
    strict_api: bool = False  # refuse unknown request fields (400) instead of ignoring them
    # answer requests naming any model (SGLang serves one and ignores the name); by default a
    # name other than the served one is a 404 (vLLM's and OpenAI's behaviour)
    ignore_model_name: bool = False
    chat_template: str | None = None
    # None: chosen from the chat template (hermes when it has no tool markup of its own).
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    log_level: str = "info"
    # NOTE: SGLang's: /metrics is always served and usage always reports cached tokens
    # (prompt_tokens_details), so these only keep its command lines working
    enable_metrics: bool = False
    enable_cache_report: bool = False
    # NOTE: SGLang's: /generate stream frames carry only the new text and ids, not all so far
    incremental_streaming_output: bool = False
    # NOTE: SGLang's: run requests' custom_logit_processor (a client's pickled code: trusted
    # clients only)
    enable_custom_logit_processor: bool = False
    stats_interval: float = 10.0
    watchdog_timeout: float = 300.0
    # ZMQ endpoint (e.g. tcp://127.0.0.1:5557) publishing the radix tree's KV events in vLLM's
    # format (BlockStored / BlockRemoved / AllBlocksCleared) for KV-aware routers; None: off
    kv_events_endpoint: str | None = None
    kv_events_block_size: int = 16  # tokens per reported block
    # A directory holding KV blocks below the radix tree (mem_cache/disk_tier.py): prefixes
    # outlive eviction and restarts. None: off. The size is bytes or a number with KB/MB/GB/TB.
    kv_disk_cache: str | None = None
    kv_disk_cache_size: str = "20GB"
    kv_disk_block_size: int = 64  # tokens per block file
    # "ngram": greedy requests draft tokens by n-gram lookup in their own tokens and verify
    # them in the step's forward (scheduler/speculative.py). None: off.
    speculative_algorithm: str | None = None
    # Top alternatives kept with each prompt token's logprob beside its KV, so echo requests
    # (lm-eval's loglikelihood) reuse a cached prefix's logprobs (mem_cache/logprob_store.py);
    # asking for more computes the prefix again. 0 keeps the tokens' own logprobs only.
    cached_top_logprobs: int = 5
    speculative_num_draft_tokens: int = 4
    spec_ngram_max: int = 4
    spec_ngram_min: int = 2
    # LoRA adapters (peft directories) served over the base model (runtime/lora/): "NAME=DIR"
    # (or a dict); more load at run time with enable_lora. max_loras bounds those held in
    # memory (least recently used idle ones are evicted), max_lora_rank their rank.
    lora_paths: tuple[str, ...] = ()
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("load_format", self.load_format, LOAD_FORMATS)
        _check_choice("quantization", self.quantization, QUANTIZATIONS)
        if self.low_memory and self.quantization == "none":
            raise ValueError("low_memory=True holds the weights as int4/int8 copies; it cannot "
                             "run with quantization='none'")  # fmt: skip
        _check_choice("schedule_policy", self.schedule_policy, SCHEDULE_POLICIES)
        _check_choice("load_balance_method", self.load_balance_method, LOAD_BALANCE_METHODS)
        _check_choice("grammar_backend", self.grammar_backend, GRAMMAR_BACKENDS)
        if self.grammar_backend == "xgrammar":
            _check_xgrammar()
        if self.attention_backend is not None:
            backend = ATTENTION_ALIASES.get(self.attention_backend, self.attention_backend)
            _check_choice("attention_backend", backend, ATTENTION_BACKENDS)
            object.__setattr__(self, "attention_backend", backend)
        if self.chunked_prefill_size == -1:  # NOTE: SGLang's "no chunking"
            object.__setattr__(self, "chunked_prefill_size", None)
        _ = self.model_overrides  # NOTE: checks json_model_override_args
        for name in (
            "max_running_requests",
            "max_prefill_tokens",
            "tp_size",
            "dp_size",
            "page_size",
            "cuda_graph_max_bs",
            "max_request_bytes",
            "kv_events_block_size",
            "kv_disk_block_size",
            "speculative_num_draft_tokens",
            "spec_ngram_min",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_total_tokens", "context_length", "chunked_prefill_size", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if not 0 <= self.cached_top_logprobs <= 20:
            raise ValueError(
                f"cached_top_logprobs must be in [0, 20], got {self.cached_top_logprobs}"
            )
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {self.max_queued_requests}")
        parse_size("kv_disk_cache_size", self.kv_disk_cache_size)
        if self.speculative_algorithm is not None:
            _check_choice("speculative_algorithm", self.speculative_algorithm, ("ngram",))
        if self.spec_ngram_max < self.spec_ngram_min:
            raise ValueError(
                f"spec_ngram_max ({self.spec_ngram_max}) must be >= spec_ngram_min "
                f"({self.spec_ngram_min})"
            )
        if self.kv_disk_cache is not None:
            self._check_disk_cache()
        self._check_lora()

    @property
    def model_overrides(self) -> dict[str, Any]:
        """``json_model_override_args`` parsed: config.json fields to replace."""
        try:
            value = json.loads(self.json_model_override_args or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"json_model_override_args is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError("json_model_override_args must be a JSON object of config.json "
                             f"fields, got {self.json_model_override_args!r}")  # fmt: skip
        return value

    def _check_lora(self) -> None:
        paths = self.lora_paths
        if isinstance(paths, dict):
            paths = [f"{name}={path}" for name, path in paths.items()]
        elif isinstance(paths, str):
            paths = [paths]
        object.__setattr__(self, "lora_paths", tuple(paths or ()))
        for name in ("max_loras", "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        adapters = self.lora_adapters  # NOTE: checks each entry's form
        if len(adapters) > self.max_loras:
            raise ValueError(
                f"lora_paths names {len(adapters)} adapters, more than max_loras "
                f"{self.max_loras} can hold"
            )
        if self.lora_enabled and (self.tp_size > 1 or self.dp_size > 1):
            raise ValueError("LoRA adapters run with tp_size 1 and dp_size 1")

    @property
    def lora_enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_paths)

    @property
    def lora_adapters(self) -> dict[str, str]:
        """``lora_paths`` as name -> directory (a bare directory is named by its base name)."""
        out: dict[str, str] = {}
        for entry in self.lora_paths:
            if not isinstance(entry, str) or not entry.strip("="):
                raise ValueError(f"lora_paths entries are NAME=DIR, got {entry!r}")
            name, sep, path = entry.partition("=")
            if not sep:
                name, path = os.path.basename(os.path.normpath(entry)), entry
            if not name or not path:
                raise ValueError(f"lora_paths entries are NAME=DIR, got {entry!r}")
            if name in out:
                raise ValueError(f"lora_paths names adapter {name!r} twice")
            out[name] = path
        return out

    def _check_disk_cache(self) -> None:
        if self.disable_radix_cache:
            raise ValueError("kv_disk_cache needs the radix cache (drop disable_radix_cache)")
        if self.kv_disk_block_size % self.page_size:
            raise ValueError(
                f"kv_disk_block_size ({self.kv_disk_block_size}) must be a multiple of "
                f"page_size ({self.page_size})"
            )

    @classmethod
    def from_kwargs(cls, **kw: Any) -> ServerArgs:
        """Build from keyword options, rejecting unknown names with the list of known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kw)

    def replace(self, **kw: Any) -> ServerArgs:
        return dataclasses.replace(self, **kw)


SIZE_UNITS = {"": 1, "B": 1, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}


def parse_size(name: str, text: str) -> int:
    """Bytes from ``"20GB"``, ``"512MB"`` or ``"1000000"`` (binary units); ValueError naming
    ``name`` otherwise."""
    raw = str(text).strip().upper()
    unit = next((u for u in ("TB", "GB", "MB", "KB", "B") if raw.endswith(u)), "")
    number = raw[: len(raw) - len(unit)].strip()
    try:
        value = float(number) * SIZE_UNITS[unit]
    except ValueError:
        raise ValueError(f"{name} must be a size such as 20GB or 512MB, got {text!r}") from None
    if not 0 < value < 2**60:
        raise ValueError(f"{name} must be a positive size, got {text!r}")
    return int(value)


def _check_xgrammar() -> None:
    """ValueError unless xgrammar imports: refused at start-up, not at the first grammar."""
    try:
        import xgrammar  # noqa: F401
    except (ImportError, OSError, RuntimeError) as e:
        raise ValueError(
            "grammar_backend 'xgrammar' needs the xgrammar package (pip install xgrammar, or "
            f"radixlm[grammars]): {e}"
        ) from None


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
