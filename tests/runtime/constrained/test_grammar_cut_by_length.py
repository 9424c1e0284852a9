"""A constrained output that ends is a whole match; one cut by ``max_new_tokens`` ends with
``length`` and is a prefix of a match. Anchored patterns in the shape of SGLang's regex tests,
on the embedded SmolLM2 (a real model writes long runs where a pattern lets it), greedy and
sampled, on every grammar backend."""

from __future__ import annotations

import pytest
import regex
from backend_params import BACKENDS
from test_constrained_engine import run

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import FinishKind, GenerateReq
from radixlm.runtime.sampling.params import parse_sampling
from radixlm.runtime.scheduler.scheduler import Scheduler

CASES = [
    (r"^(Hi|Hello|Hey)$", "Write a greeting:"),
    (r"^\d{3}$", "Write a number with three digits:"),
    (r"^\(\d{3}\) \d{3}-\d{4}$", "Write a phone number:"),
    (r"^2025-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$", "Write a date:"),
    (r"^\[2025-06-01T08:30:00Z\] WARN: Disk\.check - Volume [a-z]+ is full$", "Write a log line:"),
    (r'^\{\s*"title"\s*:\s*"[a-zA-Z ]+"\s*,\s*"year"\s*:\s*[1-9][0-9]*\s*\}$', "Write JSON:"),
]
MAX_NEW = 24  # NOTE: short enough that the runs of [a-z]+, [a-zA-Z ]+ and \s* get cut


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_match_or_are_a_prefix_of_a_match(smollm_path, backend):
    scheduler = Scheduler(ServerArgs(model_path=smollm_path, dtype="float32",
                                     max_total_tokens=4096, grammar_backend=backend))  # fmt: skip
    tok = scheduler.runner.tokenizer
    reqs = []
    for i, (pattern, prompt) in enumerate(CASES):
        for j, params in enumerate([{"temperature": 0}, {"temperature": 0.5, "sampling_seed": 1},
                                    {"temperature": 0.5, "sampling_seed": 2}]):  # fmt: skip
            sampling = parse_sampling({"max_new_tokens": MAX_NEW, "regex": pattern, **params})
            reqs.append(GenerateReq(f"{i}-{j}", tok.encode(prompt), sampling))
    kinds = set()
    for rid, (ids, finish) in run(scheduler, reqs).items():
        pattern = CASES[int(rid.split("-")[0])][0].removeprefix("^").removesuffix("$")
        text = tok.decode(ids, skip_special_tokens=True)
        kinds.add(finish.kind)
        if finish.kind is FinishKind.STOP:
            assert regex.fullmatch(pattern, text), (backend, rid, text)
        else:
            assert finish.kind is FinishKind.LENGTH and len(ids) == MAX_NEW, (rid, finish)
            assert regex.fullmatch(pattern, text, partial=True), (backend, rid, text)
    assert kinds == {FinishKind.STOP, FinishKind.LENGTH}  # NOTE: both kinds are checked
