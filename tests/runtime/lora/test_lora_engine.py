"""LoRA adapters served over one base model: token-exact with peft, alone and in mixed batches;
the radix cache never shares KV across adapters; loading, unloading and eviction."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import assert_no_leak
from tests.runtime.lora.lora_helpers import make_adapter, peft_greedy

NEW = 8
PROMPTS = [[1, 5, 9, 200, 17, 33, 4], [1, 88, 3, 3, 41], [1, 7, 7, 120, 64, 90, 12, 15, 2]]
# NOTE: a prompt past MASKED_MAX_ROWS: its prefill takes the segmented form
PROMPTS.append([1] + [(37 * i) % 400 + 3 for i in range(80)])


@pytest.fixture(scope="module")
def adapters(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    return {
        "alpha": make_adapter(tiny_llama, str(root / "alpha"), seed=1),
        "beta": make_adapter(
            tiny_llama,
            str(root / "beta"),
            seed=2,
            r=8,
            modules=("q_proj", "v_proj", "down_proj"),
            use_rslora=True,
        ),
    }


@pytest.fixture(scope="module")
def expected(tiny_llama, adapters):
    out = {name: peft_greedy(tiny_llama, path, PROMPTS, NEW) for name, path in adapters.items()}
    out[None] = peft_greedy(tiny_llama, None, PROMPTS, NEW)
    assert out["alpha"] != out[None] and out["beta"] != out[None] and out["alpha"] != out["beta"]
    return out


@pytest.fixture(scope="module")
def lora_engine(tiny_llama, adapters):
    from radixlm import Engine

    engine = Engine(
        tiny_llama,
        dtype="float32",
        max_total_tokens=4096,
        lora_paths=adapters,
        max_loras=2,
        max_lora_rank=8,
    )
    yield engine
    engine.shutdown()


def _run(engine, prompts, loras):
    outs = engine.generate(
        input_ids=prompts,
        lora_path=loras,
        sampling_params={"max_new_tokens": NEW, "temperature": 0},
    )
    return outs


def test_each_adapter_alone_equals_peft(lora_engine, expected):
    for name in ("alpha", "beta", None):
        for ids, want in zip(PROMPTS, expected[name]):
            out = lora_engine.generate(
                input_ids=ids,
                lora_path=name,
                sampling_params={"max_new_tokens": NEW, "temperature": 0},
            )
            assert out["output_ids"] == want, name
    assert_no_leak(lora_engine)


def test_one_batch_of_mixed_adapters_equals_peft(lora_engine, expected):
    lora_engine.flush_cache()
    names = ["alpha", "beta", None, "beta", "alpha", None, "alpha", "beta"]
    prompts = [PROMPTS[i % 4] for i in range(len(names))]
    outs = _run(lora_engine, prompts, names)
    for i, (name, out) in enumerate(zip(names, outs)):
        assert out["output_ids"] == expected[name][i % 4], (i, name)
    assert_no_leak(lora_engine)


def test_cache_is_keyed_by_adapter(lora_engine, expected):
    lora_engine.flush_cache()
    ids = PROMPTS[2]
    params = {"max_new_tokens": NEW, "temperature": 0}
    first = lora_engine.generate(input_ids=ids, lora_path="alpha", sampling_params=params)
    again = lora_engine.generate(input_ids=ids, lora_path="alpha", sampling_params=params)
    base = lora_engine.generate(input_ids=ids, sampling_params=params)
    beta = lora_engine.generate(input_ids=ids, lora_path="beta", sampling_params=params)
    assert again["meta_info"]["cached_tokens"] == len(ids) - 1  # same adapter: shared
    assert base["meta_info"]["cached_tokens"] == 0  # never another adapter's KV
    assert beta["meta_info"]["cached_tokens"] == 0
    assert first["output_ids"] == again["output_ids"] == expected["alpha"][2]
    assert base["output_ids"] == expected[None][2] and beta["output_ids"] == expected["beta"][2]


def test_unknown_adapter_is_a_clear_error(lora_engine):
    with pytest.raises(ValueError, match="'gamma' is not a loaded LoRA adapter"):
        lora_engine.generate(input_ids=PROMPTS[0], lora_path="gamma")


def test_load_unload_and_eviction_under_concurrent_requests(
    lora_engine, tiny_llama, adapters, expected, tmp_path
):
    # NOTE: max_loras 2 with three adapters: every batch below evicts and reloads
    lora_engine.load_lora_adapter("alpha2", adapters["alpha"])
    assert "alpha2" in lora_engine.get_server_info()["lora_adapters"]
    names = ["alpha", "beta", "alpha2", None] * 3
    prompts = [PROMPTS[i % 3] for i in range(len(names))]
    outs = _run(lora_engine, prompts, names)
    for i, (name, out) in enumerate(zip(names, outs)):
        want = expected["alpha" if name == "alpha2" else name][i % 3]
        assert out["output_ids"] == want, (i, name)
    stats = lora_engine.get_server_info()["stats"]["lora"]
    assert stats["loads"] > 3  # two at start, one at load, and reloads after eviction
    with pytest.raises(ValueError, match="already loaded"):
        lora_engine.load_lora_adapter("alpha2", adapters["alpha"])
    lora_engine.unload_lora_adapter("alpha2")
    with pytest.raises(ValueError, match="not a loaded LoRA adapter"):
        lora_engine.generate(input_ids=PROMPTS[0], lora_path="alpha2")
    with pytest.raises(ValueError, match="is not loaded"):
        lora_engine.unload_lora_adapter("alpha2")
    assert_no_leak(lora_engine)


def _broken(tmp_path, adapters, kind: str) -> str:
    src, dst = adapters["alpha"], tmp_path / kind
    dst.mkdir()
    for name in os.listdir(src):
        (dst / name).write_bytes(open(os.path.join(src, name), "rb").read())
    if kind == "bad-json":
        (dst / "adapter_config.json").write_text("{not json")
    elif kind == "no-weights":
        os.remove(dst / "adapter_model.safetensors")
    elif kind == "foreign-module":  # NOTE: a module name this model does not have
        from safetensors.torch import load_file, save_file

        file = dst / "adapter_model.safetensors"
        tensors = load_file(file)
        save_file({k.replace("o_proj", "dense"): v for k, v in tensors.items()}, file)
    return str(dst)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "is not a directory"),
        ("bad-json", "is not valid JSON"),
        ("no-weights", "has none of adapter_model.safetensors"),
        ("rank", "rank 16, above max_lora_rank 8"),
        ("foreign-module", "target module 'model.layers.0.self_attn.dense' does not exist"),
        ("lm_head", "'base_model.model.lm_head.base_layer.weight' is not a LoRA A/B weight"),
    ],
)
def test_bad_adapters_are_refused_and_serving_goes_on(
    lora_engine, tiny_llama, adapters, expected, tmp_path, kind, message
):
    if kind == "missing":
        path = str(tmp_path / "nowhere")
    elif kind == "rank":
        path = make_adapter(tiny_llama, str(tmp_path / "r16"), seed=3, r=16)
    elif kind == "lm_head":
        path = make_adapter(tiny_llama, str(tmp_path / "head"), seed=3, modules=("lm_head",))
    else:
        path = _broken(tmp_path, adapters, kind)
    with pytest.raises(ValueError, match=message):
        lora_engine.load_lora_adapter("bad", path)
    out = lora_engine.generate(
        input_ids=PROMPTS[0],
        lora_path="alpha",
        sampling_params={"max_new_tokens": NEW, "temperature": 0},
    )
    assert out["output_ids"] == expected["alpha"][0]
    assert "bad" not in lora_engine.get_server_info()["lora_adapters"]


def test_adapter_config_is_read_as_peft_does(adapters):
    with open(os.path.join(adapters["beta"], "adapter_config.json")) as f:
        config = json.load(f)
    assert config["use_rslora"] is True and config["r"] == 8


def test_qwen2_adapters_in_one_batch_equal_peft(tiny_model_factory, tmp_path):
    from radixlm import Engine

    base = tiny_model_factory("Qwen2ForCausalLM")  # NOTE: q/k/v carry a bias LoRA leaves alone
    one = make_adapter(base, str(tmp_path / "one"), seed=5, r=4)
    two = make_adapter(
        base,
        str(tmp_path / "two"),
        seed=6,
        r=2,
        modules=("k_proj", "o_proj", "up_proj"),
        lora_alpha=3,
    )
    want = {
        name: peft_greedy(base, path, PROMPTS, NEW)
        for name, path in (("one", one), ("two", two), (None, None))
    }
    engine = Engine(base, dtype="float32", max_total_tokens=2048, enable_lora=True)
    try:
        engine.load_lora_adapter("one", one)
        engine.load_lora_adapter("two", two)
        names = ["two", None, "one"] * 2
        outs = _run(engine, [PROMPTS[i % 3] for i in range(6)], names)
        for i, (name, out) in enumerate(zip(names, outs)):
            assert out["output_ids"] == want[name][i % 3], (i, name)
        assert_no_leak(engine)
    finally:
        engine.shutdown()
