"""Shared fixtures: tiny random-weight models built on the fly, and engines on them."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from radixlm.runtime.loader.model_files import default_model_path


def pytest_configure(config) -> None:
    """One torch thread in the test process: its tensors are small and the engines compute in
    their own processes. Four in-process test files took 37-41 s with one thread, idle or beside
    a busy core, against 58-150 s with torch's two spinning OpenMP threads on a 2-core machine."""
    torch.set_num_threads(1)
    # NOTE: every engine and server here would compile its decode steps in the background
    # (minutes of CPU on 2 cores); tests/runtime/test_cpu_compile.py turns it on where it checks it
    os.environ["RADIXLM_DISABLE_CPU_COMPILE"] = "1"


# NOTE: beside the shared shape (conftest.build_tiny_model: 2 layers, hidden 64, 4 heads, 2 KV
# heads): what each family needs to show what it does on a short prompt (windows of 8 tokens,
# caps, multipliers, 4 experts top 2), and ids inside our vocabulary (pad tokens)
TINY_SHAPES = {
    "LlamaForCausalLM": dict(model_type="llama"),
    "Qwen2ForCausalLM": dict(model_type="qwen2"),
    "Qwen3ForCausalLM": dict(model_type="qwen3", head_dim=32),
    "MistralForCausalLM": dict(model_type="mistral", sliding_window=8),
    "GemmaForCausalLM": dict(model_type="gemma", head_dim=16),
    "Gemma2ForCausalLM": dict(
        model_type="gemma2", head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
    ),
    "Gemma3ForCausalLM": dict(
        model_type="gemma3_text", head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=1000.0,
    ),
    "Phi3ForCausalLM": dict(model_type="phi3", sliding_window=8, pad_token_id=0),
    "GraniteForCausalLM": dict(
        model_type="granite", embedding_multiplier=3.0, residual_multiplier=0.5,
        attention_multiplier=0.3, logits_scaling=2.0,
    ),
    "Olmo2ForCausalLM": dict(model_type="olmo2", pad_token_id=0),
    "SmolLM3ForCausalLM": dict(model_type="smollm3", no_rope_layers=[1, 0], pad_token_id=0),
    "MixtralForCausalLM": dict(
        model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=8
    ),
    "Qwen2MoeForCausalLM": dict(
        model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    ),
    "Qwen3MoeForCausalLM": dict(
        model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        head_dim=16, norm_topk_prob=True,
    ),
    "OlmoeForCausalLM": dict(
        model_type="olmoe", num_experts=4, num_experts_per_tok=2, clip_qkv=0.5, pad_token_id=0
    ),
}  # fmt: skip


@pytest.fixture(scope="session")
def smol_server():
    """A server on the embedded SmolLM2-135M-Instruct, for checks that need a meaningful model
    (tests/server and tests/compat share it)."""
    from tests.server.server_helpers import launch_server

    server = launch_server(None, "--max-total-tokens", "8192", "--chunked-prefill-size", "512")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def smollm_tokenizer(smollm_path):
    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer

    return gguf_tokenizer(smollm_path)


def build_tiny_model(path: str, architecture: str, tokenizer, seed: int = 0, **overrides) -> str:
    """Save a random-weight HF model (safetensors + tokenizer) of ``architecture`` at ``path``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(TINY_SHAPES[architecture])
    model_type = shape.pop("model_type")
    config = AutoConfig.for_model(model_type, **{
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "architectures": [architecture],
        **shape,
        **overrides,
    })  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.08)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["architectures"] == [architecture]
    return path


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory, smollm_tokenizer):
    cache: dict[str, str] = {}

    def make(architecture: str = "LlamaForCausalLM", **overrides) -> str:
        key = f"{architecture}-{sorted(overrides.items())}"
        if key not in cache:
            path = str(tmp_path_factory.mktemp(architecture))
            cache[key] = build_tiny_model(path, architecture, smollm_tokenizer, **overrides)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> str:
    return tiny_model_factory("LlamaForCausalLM")


@pytest.fixture(scope="session")
def bare_llama(tiny_llama, tmp_path_factory) -> str:
    """The tiny Llama's config and weights without its tokenizer files."""
    path = tmp_path_factory.mktemp("bare-llama")
    for name in os.listdir(tiny_llama):
        if name in ("config.json", "generation_config.json") or name.endswith(".safetensors"):
            shutil.copy(os.path.join(tiny_llama, name), path)
    return str(path)


@pytest.fixture(scope="session")
def smol_engine():
    """The embedded SmolLM2 in float32, shared by the tests that only generate."""
    from radixlm import Engine

    engine = Engine(dtype="float32", max_total_tokens=16384, chunked_prefill_size=512)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama):
    from radixlm import Engine

    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=8192)
    yield engine
    engine.shutdown()


def assert_no_leak(engine, timeout: float = 10.0) -> None:
    """Every KV slot is free once the cache is flushed. Aborts are asynchronous, so the flush is
    retried until the scheduler has no request left (or ``timeout`` passes)."""
    import time

    deadline = time.monotonic() + timeout
    while not engine.flush_cache():
        assert time.monotonic() < deadline, "requests still running after the test"
        time.sleep(0.05)
    stats = engine.get_server_info()["stats"]
    assert stats["kv_invariant_ok"] is True
    assert stats["free_tokens"] == stats["max_total_tokens"], stats


@pytest.fixture(autouse=True)
def _kv_slots_freed(request):
    """After every test that used a shared engine, every KV slot is free again."""
    yield
    for name in ("smol_engine", "tiny_engine"):
        if name in request.fixturenames:
            assert_no_leak(request.getfixturevalue(name))


def force_token_processor() -> str:
    """A custom logit processor (``to_str()``) that forces each row's ``custom_params``
    ``token_id``. Defined in a function, so dill pickles the class by value, as a script's
    ``__main__`` classes, and the scheduler needs no module of the tests."""
    from radixlm.runtime.sampling.custom_logit_processor import CustomLogitProcessor

    class Force(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            for i, params in enumerate(custom_param_list):
                logits[i, :] = -float("inf")
                logits[i, params["token_id"]] = 0.0
            return logits

    return Force.to_str()
