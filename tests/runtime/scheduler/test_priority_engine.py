"""``priority`` through the Engine: accepted with the priority policy, checked on arrival."""

from __future__ import annotations

import pytest


def test_priority_reaches_the_scheduler_and_is_bounded(tiny_llama):
    from radixlm import Engine

    with Engine(tiny_llama, dtype="float32", max_total_tokens=2048, schedule_policy="priority",
                max_running_requests=1) as engine:  # fmt: skip
        greedy = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
        outs = engine.generate(["one prompt", "another prompt"], [greedy, greedy], priority=-3)
        assert [len(o["output_ids"]) for o in outs] == [6, 6]
        with pytest.raises(ValueError, match="priority must be a 32-bit integer"):
            engine.generate("x", greedy, priority=2**40)
        assert engine.flush_cache()


def test_priority_without_the_priority_policy_is_refused(tiny_engine):
    with pytest.raises(ValueError, match="--schedule-policy priority"):
        tiny_engine.generate("x", {"max_new_tokens": 1}, priority=1)
