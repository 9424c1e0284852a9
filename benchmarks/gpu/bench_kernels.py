"""GPU kernel benchmark: correctness at real shapes, decode bandwidth, extend speed vs SDPA.

Usage: ``python benchmarks/gpu/bench_kernels.py --out DIR [--smoke]``. Writes
``DIR/gpu_kernels.json`` and prints one summary line. ``--smoke`` uses tiny shapes (and the
Triton interpreter when there is no GPU) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_utils import (
    causal_flops,
    close,
    copy_bandwidth_gbs,
    gather_kv,
    make_sdpa,
    max_err,
    paged_kv,
    sdpa,
    sdpa_paged_extend,
    timed_ms,
)

TOL = {torch.float32: 2e-3, torch.bfloat16: 3e-2, torch.float16: 5e-3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (name, num_heads, num_kv_heads, head_dim, dtype)
MODEL_SHAPES = [
    ("llama3-8b", 32, 8, 128, "bf16"),
    ("smollm2-135m", 9, 3, 64, "bf16"),
    ("qwen2.5-0.5b", 14, 2, 64, "fp16"),
    ("head-dim-80", 16, 16, 80, "bf16"),
    ("fp32-check", 8, 2, 128, "fp32"),
]


def check_decode(device, shape, lens: list[int]) -> dict:
    from radixlm.kernels.decode_attention import (
        choose_num_kv_splits,
        decode_attention,
        decode_attention_ref,
    )

    name, heads, kv_heads, head_dim, dt = shape
    dtype, scale = DTYPES[dt], head_dim**-0.5
    kv = paged_kv(lens, kv_heads, head_dim, dtype, device)
    q = torch.randn(len(lens), heads, head_dim, device=device).to(dtype)
    args = (q, kv.k_buf, kv.v_buf, kv.req_to_token, kv.req_slots, kv.seq_lens, scale)
    splits = choose_num_kv_splits(len(lens), kv_heads, max(lens), _num_sms(device))
    out = decode_attention(*args, num_kv_splits=splits)
    ref = decode_attention_ref(*args)
    k, v = gather_kv(kv)
    keys = torch.arange(max(lens), device=device)
    mask = (keys[None, :] < kv.seq_lens[:, None])[:, None, None, :]
    via_sdpa = sdpa(q[:, :, None], k, v, scale, mask=mask)
    via_sdpa = via_sdpa[:, :, 0]
    errs = {"vs_ref": max_err(out, ref), "vs_sdpa": max_err(out, via_sdpa)}
    ok = close(out, ref, TOL[dtype]) and close(out, via_sdpa, TOL[dtype])
    return {"kernel": "decode", "shape": name, "lens": lens, "splits": splits, **errs, "ok": ok}


def check_extend(device, shape, prefixes: list[int], extends: list[int]) -> dict:
    from radixlm.kernels.extend_attention import (
        extend_attention,
        extend_attention_ref,
        extend_starts_of,
    )

    name, heads, kv_heads, head_dim, dt = shape
    dtype, scale = DTYPES[dt], head_dim**-0.5
    kv = paged_kv([p + e for p, e in zip(prefixes, extends)], kv_heads, head_dim, dtype, device)
    q = torch.randn(sum(extends), heads, head_dim, device=device).to(dtype)
    ext = torch.tensor(extends, device=device)
    common = (q, kv.k_buf, kv.v_buf, kv.req_to_token, kv.req_slots)
    pre = torch.tensor(prefixes, device=device)
    out = extend_attention(*common, pre, ext, extend_starts_of(ext), max(extends), scale)
    ref = extend_attention_ref(*common, pre, ext, scale)
    via_sdpa = sdpa_paged_extend(q, kv, prefixes, extends, scale)
    errs = {"vs_ref": max_err(out, ref), "vs_sdpa": max_err(out, via_sdpa)}
    ok = close(out, ref, TOL[dtype]) and close(out, via_sdpa, TOL[dtype])
    return {
        "kernel": "extend",
        "shape": name,
        "prefixes": prefixes,
        "extends": extends,
        **errs,
        "ok": ok,
    }


def correctness(device, smoke: bool) -> list[dict]:
    shapes = MODEL_SHAPES[1:2] if smoke else MODEL_SHAPES
    dec_lens = [1, 37, 64, 5] if smoke else [1, 4096, 777, 2048, 130, 3000, 64, 1500, 8191, 2]
    pre, ext = (
        ([0, 20, 3], [9, 1, 30]) if smoke else ([0, 1000, 37, 2048, 0], [1024, 300, 1, 513, 77])
    )
    checks = [partial(check_decode, device, shape, dec_lens) for shape in shapes]
    checks += [partial(check_extend, device, shape, pre, ext) for shape in shapes]
    return [_guarded(check) for check in checks]


def _guarded(check: partial) -> dict:
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - report the failure, run the other checks
        return {"check": check.func.__name__, "shape": check.args[1][0], "ok": False,
                "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip


def decode_bandwidth(device, smoke: bool) -> dict:
    """Batch 64 x 4k context decode: GB/s of KV read, kernel vs SDPA (dense and gathered)."""
    from radixlm.kernels.decode_attention import choose_num_kv_splits

    batch, ctx, heads, kv_heads, head_dim = (4, 64, 4, 2, 64) if smoke else (64, 4096, 32, 8, 128)
    dtype = torch.bfloat16
    q = torch.randn(batch, heads, head_dim, device=device).to(dtype)
    kv_bytes = 2 * batch * ctx * kv_heads * head_dim * dtype.itemsize
    chosen = choose_num_kv_splits(batch, kv_heads, ctx, _num_sms(device))
    shape = {"batch": batch, "ctx": ctx, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    result = {**shape, "dtype": "bf16", "kv_bytes": kv_bytes, "chosen_splits": chosen}
    for layout in ("contiguous", "scattered"):
        kv = paged_kv(
            [ctx] * batch, kv_heads, head_dim, dtype, device, scattered=layout == "scattered"
        )
        result[layout] = _decode_sweep(device, q, kv, chosen, kv_bytes)
    result.update(_decode_sdpa(device, q, kv, kv_bytes))
    return result


def _decode_sweep(device, q, kv, chosen: int, kv_bytes: int) -> dict:
    from radixlm.kernels.decode_attention import decode_attention

    scale = q.shape[-1] ** -0.5
    args = (q, kv.k_buf, kv.v_buf, kv.req_to_token, kv.req_slots, kv.seq_lens, scale)
    sweep = {}
    for splits in sorted({1, 2, 4, 8, chosen}):
        for block_n in (32, 64):
            ms = timed_ms(partial(decode_attention, *args, splits, block_n=block_n), device)
            sweep[f"splits={splits},block_n={block_n}"] = {"ms": ms, "gbs": kv_bytes / ms / 1e6}
    ms = timed_ms(lambda: decode_attention(*args, chosen), device)
    best = max(sweep, key=lambda key: sweep[key]["gbs"])
    return {"triton_default": {"ms": ms, "gbs": kv_bytes / ms / 1e6}, "best": best, "sweep": sweep}


def _decode_sdpa(device, q, kv, kv_bytes: int) -> dict:
    """SDPA over pre-gathered contiguous k/v, and gather + SDPA (the torch backend's way)."""
    scale, q4 = q.shape[-1] ** -0.5, q[:, :, None]
    k, v = (t.contiguous() for t in gather_kv(kv))
    dense, mode = make_sdpa(q4, k, v, scale)
    del k, v

    group = q.shape[1] // kv.k_buf.shape[1]

    def gather_then_attend() -> torch.Tensor:
        k, v = gather_kv(kv)
        if mode == "repeat_kv":
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(
            q4, k, v, scale=scale, enable_gqa=mode == "enable_gqa"
        )

    dense_ms = timed_ms(dense, device)
    gather_ms = timed_ms(gather_then_attend, device)
    return {
        "sdpa_dense": {"ms": dense_ms, "gbs": kv_bytes / dense_ms / 1e6, "gqa": mode},
        "sdpa_gather_then_attend": {"ms": gather_ms, "gbs": kv_bytes / gather_ms / 1e6},
    }


def extend_speed(device, smoke: bool) -> list[dict]:
    """Extend kernel vs SDPA (on contiguous k/v) for the same causal work; a mixed batch vs
    splitting it into a decode-kernel part and an extend-kernel part."""
    if smoke:
        cases = [
            ("prefill", [0, 0], [40, 40]),
            ("chunked", [30], [20]),
            ("mixed", [0, 9, 9], [20, 1, 1]),
        ]
        heads, kv_heads, head_dim = 4, 2, 64
    else:
        cases = [("prefill-4x4k", [0] * 4, [4096] * 4), ("chunk-4x(4k+1k)", [4096] * 4, [1024] * 4),
                 ("mixed-1x2k+63x1@4k", [0] + [4096] * 63, [2048] + [1] * 63)]  # fmt: skip
        heads, kv_heads, head_dim = 32, 8, 128
    return [
        _extend_case(device, name, pre, ext, heads, kv_heads, head_dim) for name, pre, ext in cases
    ]


def _extend_case(device, name, prefixes, extends, heads, kv_heads, head_dim) -> dict:
    from radixlm.kernels.extend_attention import extend_attention, extend_starts_of

    dtype, scale = torch.bfloat16, head_dim**-0.5
    kv = paged_kv([p + e for p, e in zip(prefixes, extends)], kv_heads, head_dim, dtype, device)
    q = torch.randn(sum(extends), heads, head_dim, device=device).to(dtype)
    ext, pre = torch.tensor(extends, device=device), torch.tensor(prefixes, device=device)
    common = (q, kv.k_buf, kv.v_buf, kv.req_to_token, kv.req_slots, pre, ext)
    tail = (extend_starts_of(ext), max(extends), scale)
    triton_ms = timed_ms(lambda: extend_attention(*common, *tail), device)
    flops = causal_flops(prefixes, extends, heads, head_dim)
    result = {"case": name, "triton_ms": triton_ms, "triton_tflops": flops / triton_ms / 1e9}
    if len(set(extends)) == 1 and len(set(prefixes)) == 1:
        result.update(_sdpa_uniform(device, q, kv, prefixes[0], extends[0], scale, flops))
    else:
        result["split_decode_plus_extend_ms"] = _split_mixed_ms(device, q, kv, prefixes, extends)
    return result


def _sdpa_uniform(device, q, kv, prefix: int, extend: int, scale: float, flops: float) -> dict:
    """SDPA on contiguous, pre-gathered k/v with a (bottom-right) causal mask."""
    batch = kv.req_slots.numel()
    qp = q.view(batch, extend, *q.shape[1:]).transpose(1, 2).contiguous()
    k, v = (t.contiguous() for t in gather_kv(kv))
    mask, is_causal = None, prefix == 0
    if prefix:
        try:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(extend, prefix + extend)
        except ImportError:
            keys = torch.arange(prefix + extend, device=device)
            mask = keys[None, :] <= prefix + torch.arange(extend, device=device)[:, None]
    fn, mode = make_sdpa(qp, k, v, scale, mask=mask, is_causal=is_causal)
    ms = timed_ms(fn, device)
    return {"sdpa_ms": ms, "sdpa_tflops": flops / ms / 1e9, "sdpa_gqa": mode}


def _split_mixed_ms(device, q, kv, prefixes: list[int], extends: list[int]) -> float:
    """The same mixed batch as one decode-kernel launch (1-token rows) + one extend launch."""
    from radixlm.kernels.decode_attention import choose_num_kv_splits, decode_attention
    from radixlm.kernels.extend_attention import extend_attention, extend_starts_of

    scale, starts = q.shape[-1] ** -0.5, torch.tensor(extends).cumsum(0) - torch.tensor(extends)
    dec = [i for i, e in enumerate(extends) if e == 1]
    ext = [i for i, e in enumerate(extends) if e != 1]
    dec_q = q[starts[dec].to(device)]
    ext_q = torch.cat([q[starts[i] : starts[i] + extends[i]] for i in ext])
    rows_d, rows_e = torch.tensor(dec, device=device), torch.tensor(ext, device=device)
    ext_lens = torch.tensor([extends[i] for i in ext], device=device)
    ext_pre = torch.tensor([prefixes[i] for i in ext], device=device)
    splits = choose_num_kv_splits(
        len(dec), kv.k_buf.shape[1], max(kv.seq_lens.tolist()), _num_sms(device)
    )
    e_starts, max_e = extend_starts_of(ext_lens), int(ext_lens.max())
    buf = (kv.k_buf, kv.v_buf, kv.req_to_token)

    def both() -> None:
        decode_attention(dec_q, *buf, kv.req_slots[rows_d], kv.seq_lens[rows_d], scale, splits)
        extend_attention(
            ext_q, *buf, kv.req_slots[rows_e], ext_pre, ext_lens, e_starts, max_e, scale
        )

    return timed_ms(both, device)


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def run(args: argparse.Namespace, out: Path) -> dict:
    """Every section, the JSON rewritten after each so a timeout loses only the one running."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    report: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "smoke": args.smoke}  # fmt: skip
    sections = {
        "copy_bandwidth": lambda: copy_bandwidth_gbs(device, 2**20 if args.smoke else 2**31),
        "correctness": lambda: correctness(device, args.smoke),
        "decode_bandwidth": lambda: decode_bandwidth(device, args.smoke),
        "extend_speed": lambda: extend_speed(device, args.smoke),
    }
    for name, fn in sections.items():
        start = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
        report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - start, 2)
        print(f"[bench] {name} done in {report['section_seconds'][name]} s", flush=True)
        (out / "gpu_kernels.json").write_text(json.dumps(report, indent=2))
    return report


def summary(report: dict) -> str:
    checks = report.get("correctness")
    ok = isinstance(checks, list) and all(c["ok"] for c in checks)
    dec = report.get("decode_bandwidth", {}).get("scattered", {}).get("triton_default", {})
    copy = report.get("copy_bandwidth", {}).get("gbs_read_plus_write", float("nan"))
    cases = report.get("extend_speed")
    prefill = cases[0] if isinstance(cases, list) and cases else {}
    speedup = prefill.get("sdpa_ms", float("nan")) / prefill.get("triton_ms", float("nan"))
    return (f"gpu_kernels: correctness={'ok' if ok else 'FAIL'} "
            f"decode_gbs={dec.get('gbs', float('nan')):.0f} copy_gbs={copy:.0f} "
            f"prefill_sdpa_over_triton={speedup:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "benchmarks/gpu/out"))
    parser.add_argument("--smoke", action="store_true", help="tiny shapes; interpreter on CPU")
    args = parser.parse_args()
    if args.smoke and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(summary(run(args, out)))


if __name__ == "__main__":
    main()
