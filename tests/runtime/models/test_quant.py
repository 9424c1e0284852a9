"""Int4 decode copies: a Q4_1-structured weight comes back exactly; routing by step size."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.models import quant
from radixlm.runtime.models.onednn import onednn_bf16
from radixlm.runtime.models.quant import (
    GROUP,
    MAX_INT4_ROWS,
    Int4DecodeLinear,
    apply_int4_decode,
    int4_available,
)

pytestmark = pytest.mark.skipif(not int4_available(), reason="torch lacks the CPU int4 kernel")


def q4_0_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Blocks of 32 holding ``d * (q - 8)`` whose largest magnitude is code 0 (as Q4_0 stores
    them); code 15 need not occur."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(1, 15, (n, k // GROUP, GROUP), generator=gen)
    codes[..., 0] = 0
    d = (torch.rand(n, k // GROUP, 1, generator=gen) * 0.01 + 0.001).bfloat16().float()
    return (d * (codes - 8)).reshape(n, k).bfloat16()


def q4_1_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """Blocks of 32 holding ``d * q + m`` with every code 0..15 present (as Q4_1 stores them)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k // GROUP, GROUP), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15
    d = (torch.rand(n, k // GROUP, 1, generator=gen) * 0.01 + 0.001).bfloat16().float()
    m = (-8 * d + torch.randn(n, k // GROUP, 1, generator=gen) * 0.001).bfloat16().float()
    return (codes * d + m).reshape(n, k).bfloat16()


@pytest.mark.parametrize("make, bias", [(q4_1_weight, False), (q4_1_weight, True),
                                         (q4_0_weight, False)])  # fmt: skip
def test_int4_copy_reproduces_a_q4_weight(make, bias):
    linear = nn.Linear(96, 48, bias=bias, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(make(48, 96))
    int4 = Int4DecodeLinear(linear)
    for rows in (1, 3, MAX_INT4_ROWS):
        x = torch.randn(rows, 96).bfloat16()
        want = x.float() @ linear.weight.float().t() + (linear.bias.float() if bias else 0)
        got = int4(x).float()
        assert (got - want).abs().max() <= 0.01 * want.abs().max()


def test_quantizing_in_pieces_gives_the_whole_tensors_codes(monkeypatch):
    weight = q4_1_weight(80, 96, seed=3)
    whole = quant.quantize_int4(weight)
    monkeypatch.setattr(quant, "QUANTIZE_WEIGHTS", 7 * 96)  # NOTE: 7 rows, a ragged last piece
    pieces = quant.quantize_int4(weight)
    assert torch.equal(pieces[0], whole[0]) and torch.equal(pieces[1], whole[1])


@pytest.mark.parametrize("rows", [MAX_INT4_ROWS + 1, 32, 300])
def test_larger_steps_use_the_bf16_weight(rows):
    """Through oneDNN's blocked layout where torch has it: the same bits as ``F.linear`` in
    inference mode, where the runner runs (with autograd on, a bias that wants gradients is
    added apart, rounding once more)."""
    linear = nn.Linear(64, 32, dtype=torch.bfloat16)
    int4 = Int4DecodeLinear(linear)
    assert (int4.dense is not None) == onednn_bf16()
    assert int4.weight is None or int4.dense is None  # NOTE: one bf16 copy, not two
    with torch.inference_mode():
        for seed in range(16):
            x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)).bfloat16()
            assert torch.equal(int4(x), F.linear(x, linear.weight, linear.bias))


def test_shapes_the_kernel_cannot_take_keep_bf16_only():
    model = nn.Module()
    model.o_proj = nn.Linear(64, 40, dtype=torch.bfloat16)  # 40 outputs: not a multiple of 16
    model.down_proj = nn.Linear(48, 32, dtype=torch.bfloat16)  # 48 inputs: not groups of 32
    assert apply_int4_decode(model) == 0 and type(model.o_proj) is nn.Linear


def test_apply_int4_decode_covers_every_projection_and_gives_the_head_int8(tiny_llama):
    from radixlm.runtime.loader.loader import load_model
    from radixlm.runtime.models.quant_head import Int8DecodeHead, int8_head_available

    loaded = load_model(ServerArgs(model_path=tiny_llama), torch.device("cpu"), torch.bfloat16)
    assert apply_int4_decode(loaded.model) == 4 * loaded.config.num_layers
    head = Int8DecodeHead if int8_head_available() else nn.Linear
    assert type(loaded.model.lm_head) is head
    assert not loaded.four_bit_checkpoint


def test_quantization_is_validated(tiny_llama):
    from radixlm.runtime.executor.model_runner import ModelRunner

    with pytest.raises(ValueError, match="quantization"):
        ServerArgs(quantization="int8")
    with pytest.raises(ValueError, match="quantization='int4'"):
        ModelRunner(ServerArgs(model_path=tiny_llama, dtype="float32", quantization="int4"))


def test_auto_follows_a_four_bit_gguf(smollm_path):
    from radixlm.runtime.executor.model_runner import ModelRunner
    from radixlm.runtime.messages import GenerateReq, Sampling
    from radixlm.runtime.models.gguf_quant import bytes_by_type
    from radixlm.runtime.scheduler.scheduler import Scheduler

    base = dict(device="cpu", max_total_tokens=256)
    scheduler = Scheduler(ServerArgs(**base, dtype="bfloat16"))
    assert scheduler.runner.int4_decode
    tok = scheduler.runner.tokenizer
    ids = tok.encode("The capital of France is")
    scheduler.handle(GenerateReq("r", ids, Sampling(max_new_tokens=8, temperature=0)))
    out = []
    while scheduler.has_work:
        out += [t for o in scheduler.step() for t in o.new_ids]
    # NOTE: every step here has <= 8 tokens (a 5-token prompt), so all of them run int4.
    assert tok.decode(out) == " Paris.\n\nThe answer is:"
    assert not ModelRunner(ServerArgs(**base, dtype="bfloat16", quantization="none")).int4_decode
    # NOTE: the int4 path is bf16's; in float32 auto keeps the file's Q4_1 blocks instead
    runner = ModelRunner(ServerArgs(**base, dtype="float32"))
    assert not runner.int4_decode and "Q4_1" in bytes_by_type(runner.model)
    dense = ModelRunner(ServerArgs(**base, dtype="float32", quantization="none"))
    assert set(bytes_by_type(dense.model)) == {"float32"}
