"""Mixture of experts on CPU: the grouped experts path, and a whole MoE model against HF.

1. One sparse MLP layer (hidden 1024, 32 experts of 512, top 4; float32) on 1..256 tokens:
   radixlm's grouped path (tokens sorted by expert, one GEMM pair per active expert), a loop
   over the (token, expert) pairs (``moe.loop_experts``), and Hugging Face's own
   ``Qwen3MoeSparseMoeBlock`` (a loop over the hit experts) on the same weights.
2. A random-weight Qwen3-MoE (hidden 512, 4 layers, 16 experts of 256, top 4, SmolLM2's
   vocabulary) served by ``Engine`` (float32, eager: the compiled CPU steps are the plain
   decoder's) against HF ``generate()`` in float32, greedy, same prompts: one stream of 64
   tokens and a batch of 8. The engine's numbers are from its first minute after a fresh start
   (its first requests) and warm. llama.cpp is not run: writing a GGUF of a random Qwen3-MoE
   takes llama.cpp's converter, which is not installed here.

Run: ``.venv/bin/python benchmarks/bench_moe.py``
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from common import bar_chart, log, save  # noqa: E402

NEW_TOKENS = 64
BATCH = 8


def _best(fn, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def layer_bench() -> dict:
    from transformers import AutoConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from radixlm.runtime.config import ModelConfig
    from radixlm.runtime.models.moe import SparseMoE, loop_experts

    hf_cfg = AutoConfig.for_model(
        "qwen3_moe", hidden_size=1024, moe_intermediate_size=512, num_experts=32,
        num_experts_per_tok=4, norm_topk_prob=True, num_attention_heads=8,
    )  # fmt: skip
    arch = {"architectures": ["Qwen3MoeForCausalLM"]}
    config = ModelConfig.from_hf_dict({**hf_cfg.to_dict(), **arch})
    torch.manual_seed(0)
    ours = SparseMoE(config).eval()
    hf = Qwen3MoeSparseMoeBlock(hf_cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_(0, 0.02)
        hf.gate.weight.copy_(ours.gate.weight)
        hf.experts.gate_up_proj.copy_(ours.experts.gate_up_proj)
        hf.experts.down_proj.copy_(ours.experts.down_proj)
    rows = []
    for tokens in (1, 8, 64, 256):
        x = torch.randn(tokens, 1024)
        with torch.inference_mode():
            want = hf(x[None])
            want = want[0] if isinstance(want, tuple) else want
            torch.testing.assert_close(ours(x), want[0], atol=1e-5, rtol=1e-5)
            runs = 20 if tokens <= 8 else 5
            grouped = _best(lambda x=x: ours(x), runs)
            per_pair = _best(lambda x=x: loop_experts(ours, x), max(2, runs // 4))
            hf_s = _best(lambda x=x: hf(x[None]), runs)
        rows.append({"tokens": tokens, "grouped_ms": grouped * 1e3, "pair_loop_ms": per_pair * 1e3,
                     "hf_block_ms": hf_s * 1e3, "vs_pair_loop": per_pair / grouped,
                     "vs_hf_block": hf_s / grouped})  # fmt: skip
        log(f"layer, {tokens} tokens: grouped {grouped * 1e3:.2f} ms, pair loop "
            f"{per_pair * 1e3:.2f} ms ({per_pair / grouped:.1f}x), HF block "
            f"{hf_s * 1e3:.2f} ms ({hf_s / grouped:.2f}x)")  # fmt: skip
    return {"rows": rows}


def build_model(path: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from radixlm.runtime.loader.gguf_loader import gguf_tokenizer
    from radixlm.runtime.loader.model_files import default_model_path

    tokenizer = gguf_tokenizer(default_model_path())
    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=len(tokenizer), hidden_size=512, intermediate_size=1024,
        moe_intermediate_size=256, num_experts=16, num_experts_per_tok=4, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=4, head_dim=64, norm_topk_prob=True,
        tie_word_embeddings=False, architectures=["Qwen3MoeForCausalLM"],
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5 if p.dim() == 1 else 0.05)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(2, 40000, (96 + 8 * i,), generator=g).tolist() for i in range(BATCH)]


def hf_bench(path: str) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    ps = prompts()
    out = {}
    with torch.inference_mode():
        start = time.perf_counter()
        single = model.generate(torch.tensor([ps[0]]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=0)  # fmt: skip
        out["single_tok_s"] = NEW_TOKENS / (time.perf_counter() - start)
        out["single_ids"] = single[0, len(ps[0]):].tolist()
        # NOTE: left-padded batch, as HF batches generation
        width = max(map(len, ps))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in ps])
        mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in ps])[:, None])
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask.long(), max_new_tokens=NEW_TOKENS,
                       do_sample=False, pad_token_id=0)  # fmt: skip
        out["batch_tok_s"] = BATCH * NEW_TOKENS / (time.perf_counter() - start)
    log(f"HF generate: {out['single_tok_s']:.1f} tok/s single, {out['batch_tok_s']:.1f} batch")
    return out


def engine_bench(path: str) -> dict:
    from radixlm import Engine

    ps = prompts()
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    start = time.perf_counter()
    engine = Engine(path, dtype="float32", max_total_tokens=8192)
    out = {"ready_s": time.perf_counter() - start}
    try:
        for phase in ("first", "warm"):
            engine.flush_cache()
            t = time.perf_counter()
            single = engine.generate(input_ids=ps[0], sampling_params=params)
            out[f"{phase}_single_tok_s"] = NEW_TOKENS / (time.perf_counter() - t)
            engine.flush_cache()
            t = time.perf_counter()
            engine.generate(input_ids=ps, sampling_params=params)
            out[f"{phase}_batch_tok_s"] = BATCH * NEW_TOKENS / (time.perf_counter() - t)
        out["single_ids"] = single["output_ids"]
    finally:
        engine.shutdown()
    log(f"radixlm: ready in {out['ready_s']:.1f} s; first {out['first_single_tok_s']:.1f} / "
        f"{out['first_batch_tok_s']:.1f} tok/s, warm {out['warm_single_tok_s']:.1f} / "
        f"{out['warm_batch_tok_s']:.1f} (single / batch)")  # fmt: skip
    return out


def main() -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    result = {"layer": layer_bench()}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(tmp)
        hf = hf_bench(path)
        ours = engine_bench(path)
    result.update(hf=hf, radixlm=ours, same_tokens=hf.pop("single_ids") == ours.pop("single_ids"))
    result["ratios"] = {
        "single_first_vs_hf": ours["first_single_tok_s"] / hf["single_tok_s"],
        "single_warm_vs_hf": ours["warm_single_tok_s"] / hf["single_tok_s"],
        "batch_first_vs_hf": ours["first_batch_tok_s"] / hf["batch_tok_s"],
        "batch_warm_vs_hf": ours["warm_batch_tok_s"] / hf["batch_tok_s"],
    }
    log(f"ratios vs HF generate: {result['ratios']}; same greedy tokens: {result['same_tokens']}")
    save("bench_moe", result)
    bar_chart(
        "bench_moe",
        ["HF single", "radixlm single (first)", "radixlm single (warm)",
         "HF batch 8", "radixlm batch 8 (first)", "radixlm batch 8 (warm)"],
        [hf["single_tok_s"], ours["first_single_tok_s"], ours["warm_single_tok_s"],
         hf["batch_tok_s"], ours["first_batch_tok_s"], ours["warm_batch_tok_s"]],
        "tokens/s", "Qwen3-MoE (random, 4 layers, 16 experts top 4), float32, CPU",
    )  # fmt: skip


if __name__ == "__main__":
    main()
