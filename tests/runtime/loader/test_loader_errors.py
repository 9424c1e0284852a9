"""Loading: clear errors for missing files and unsupported architectures; configs from files."""

from __future__ import annotations

import json
import shutil

import pytest

from radixlm.runtime.config import ModelConfig, ServerArgs
from radixlm.runtime.loader.model_files import load_config


def test_missing_path_names_the_path():
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        load_config(ServerArgs(model_path="/no/such/model"))


def test_directory_without_weights_names_what_is_missing(tiny_llama, tmp_path):
    from radixlm.runtime.loader.loader import load_model

    shutil.copy(f"{tiny_llama}/config.json", tmp_path / "config.json")
    import torch

    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_model(
            ServerArgs(model_path=str(tmp_path), tokenizer_path=tiny_llama),
            torch.device("cpu"),
            torch.float32,
        )


def test_unsupported_architecture_is_named(tiny_llama, tmp_path):
    import torch

    from radixlm.runtime.loader.loader import load_model

    for f in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_llama}/{f}", tmp_path / f)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*runs: .*Gemma2ForCausalLM"):
        load_model(
            ServerArgs(model_path=str(tmp_path), tokenizer_path=tiny_llama),
            torch.device("cpu"),
            torch.float32,
        )
    from radixlm import Engine

    # NOTE: refused in the caller's process, before any process starts
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'"):
        Engine(str(tmp_path), tokenizer_path=tiny_llama)


def test_every_listed_architecture_has_a_model_class():
    from radixlm.runtime.models.architectures import ARCHITECTURES
    from radixlm.runtime.models.registry import MODELS, get_model_class

    get_model_class("LlamaForCausalLM")  # NOTE: imports every family
    assert sorted(MODELS) == list(ARCHITECTURES)


def test_default_model_config_is_smollm2():
    config, path, fmt = load_config(ServerArgs())
    assert fmt == "gguf" and path.endswith(".gguf")
    assert (config.architecture, config.num_layers, config.num_heads, config.num_kv_heads) == (
        "LlamaForCausalLM",
        30,
        9,
        3,
    )
    assert config.tie_word_embeddings and config.vocab_size == 49152


def test_hf_config_fields():
    c = ModelConfig.from_hf_dict(
        {
            "architectures": ["Qwen2ForCausalLM"],
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 100,
            "eos_token_id": [5, 6],
            "rope_theta": 1e6,
            "tie_word_embeddings": True,
        }
    )
    assert c.attention_bias and not c.qk_norm and c.head_dim == 16
    assert c.eos_token_ids == (5, 6) and c.rope_theta == 1e6 and c.tie_word_embeddings


@pytest.mark.parametrize(
    "field,value",
    [
        ("dtype", "int8"),
        ("schedule_policy", "sjf"),
        ("max_running_requests", 0),
        ("mem_fraction_static", 1.5),
    ],
)
def test_server_args_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        ServerArgs(**{field: value})


def test_unknown_engine_option_rejected():
    with pytest.raises(ValueError, match="no_such_option"):
        ServerArgs.from_kwargs(no_such_option=1)


def test_json_model_override_args_replace_config_fields(tiny_llama, smollm_path):
    config, _, _ = load_config(ServerArgs(model_path=tiny_llama,
                                          json_model_override_args='{"rope_theta": 1234.0}'))
    assert config.rope_theta == 1234.0
    assert load_config(ServerArgs(model_path=tiny_llama))[0].rope_theta != 1234.0
    with pytest.raises(ValueError, match="GGUF"):
        load_config(ServerArgs(model_path=smollm_path, json_model_override_args='{"a": 1}'))
