"""The scheduler with attention_backend="triton" gives the torch backend's greedy tokens.

On CPU the kernels run under Triton's interpreter, which must be switched on before triton is
first imported, so the comparison runs in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

SCRIPT = r"""
import json, sys
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import GenerateReq, Sampling
from radixlm.runtime.scheduler.scheduler import Scheduler

def run(backend):
    args = ServerArgs(model_path=sys.argv[1], dtype="float32", max_total_tokens=1024,
                      chunked_prefill_size=16, attention_backend=backend)
    s = Scheduler(args)
    prefix = list(range(300, 340))
    for i in range(3):
        ids = prefix + [500 + i] * (i + 1)
        s.handle(GenerateReq(f"r{i}", ids, Sampling(max_new_tokens=6, temperature=0,
                                                      ignore_eos=True)))
    out = {}
    while s.has_work:
        for o in s.step():
            out.setdefault(o.rid, []).extend(o.new_ids)
    s.cache.check_idle()
    return out

print(json.dumps({"torch": run("torch"), "triton": run("triton")}))
"""


def test_engine_triton_backend_matches_torch(tiny_llama):
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_llama], env=env, capture_output=True, text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["triton"] == result["torch"]
    assert all(len(v) == 6 for v in result["torch"].values())
