"""The scheduler in-process: outputs do not depend on caching, chunking, memory or policy."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import AbortReq, FinishKind, GenerateReq, Sampling
from radixlm.runtime.scheduler.scheduler import Scheduler

SHARED = list(range(1000, 1150))


def make_requests(n: int = 12, seed: int = 0) -> list[GenerateReq]:
    """Prompts with shared prefixes of different depths, so the radix tree branches."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        prefix = SHARED[: rng.choice([0, 40, 150])]
        prompt = prefix + [rng.randrange(100, 40000) for _ in range(rng.randint(3, 60))]
        sampling = Sampling(max_new_tokens=rng.randint(4, 24), temperature=0.0, ignore_eos=True)
        reqs.append(GenerateReq(rid=f"r{i}", input_ids=prompt, sampling=sampling))
    return reqs


def run(
    scheduler: Scheduler, reqs: list[GenerateReq], max_steps: int = 5000
) -> dict[str, list[int]]:
    outs: dict[str, list[int]] = {}
    finished: dict[str, dict] = {}
    for r in reqs:
        scheduler.handle(r)
    for _ in range(max_steps):
        if not scheduler.has_work:
            break
        for o in scheduler.step():
            outs.setdefault(o.rid, []).extend(o.new_ids)
            if o.finish is not None:
                finished[o.rid] = o.finish
    assert not scheduler.has_work, "scheduler did not drain"
    assert set(finished) == {r.rid for r in reqs}
    scheduler.cache.check_idle()
    return outs


def make_scheduler(model: str, **kw) -> Scheduler:
    return Scheduler(
        ServerArgs(model_path=model, dtype="float32", **{"max_total_tokens": 4096, **kw})
    )


@pytest.fixture(scope="module")
def reference(tiny_llama) -> dict[str, list[int]]:
    return run(
        make_scheduler(tiny_llama, disable_radix_cache=True, chunked_prefill_size=None),
        make_requests(),
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(chunked_prefill_size=16),
        dict(chunked_prefill_size=64),
        dict(chunked_prefill_size=None),
        dict(disable_radix_cache=True, chunked_prefill_size=16),
        dict(page_size=4),
    ],
)
def test_outputs_independent_of_cache_and_chunking(tiny_llama, reference, kw):
    assert run(make_scheduler(tiny_llama, **kw), make_requests()) == reference


@pytest.mark.parametrize("policy", ["lpm", "dfs-weight", "fcfs", "lof", "random", "priority"])
def test_outputs_independent_of_policy(tiny_llama, reference, policy):
    assert run(make_scheduler(tiny_llama, schedule_policy=policy), make_requests()) == reference


def test_priority_schedules_lower_values_first_and_preempts(tiny_llama):
    """Two low-priority requests fill the running places; a high-priority one arriving later
    retracts one of them, finishes first, and every output is what it is alone."""
    scheduler = make_scheduler(tiny_llama, schedule_policy="priority", max_running_requests=2)
    greedy = Sampling(max_new_tokens=40, temperature=0.0, ignore_eos=True)
    low = [GenerateReq(rid=f"low{i}", input_ids=SHARED[i : i + 20], sampling=greedy, priority=5)
           for i in range(2)]  # fmt: skip
    urgent = GenerateReq(rid="urgent", input_ids=SHARED[50:70], priority=-1,
                         sampling=Sampling(max_new_tokens=8, temperature=0.0, ignore_eos=True))
    for r in low:
        scheduler.handle(r)
    order, outs = [], {}
    for step in range(500):
        if step == 3:
            scheduler.handle(urgent)
        for o in scheduler.step():
            outs.setdefault(o.rid, []).extend(o.new_ids)
            if o.finish is not None:
                order.append(o.rid)
        if not scheduler.has_work:
            break
    assert order[0] == "urgent" and sorted(order) == ["low0", "low1", "urgent"]
    assert scheduler.stats.retractions >= 1
    alone = make_scheduler(tiny_llama, disable_radix_cache=True)
    assert run(alone, [*low, urgent]) == outs
    scheduler.cache.check_idle()


def test_small_pool_forces_eviction_and_retraction(tiny_llama, reference):
    scheduler = make_scheduler(tiny_llama, max_total_tokens=260, chunked_prefill_size=32)
    run(
        scheduler,
        [GenerateReq(rid="warm", input_ids=SHARED + [7], sampling=Sampling(max_new_tokens=1))],
    )
    assert run(scheduler, make_requests()) == reference
    assert scheduler.stats.retractions > 0


def test_shared_prefix_is_computed_once(tiny_llama):
    scheduler = make_scheduler(tiny_llama, max_total_tokens=16384)
    prefix = [(7 * i) % 30000 + 100 for i in range(800)]
    reqs = [
        GenerateReq(
            rid=f"q{i}",
            input_ids=prefix + [200 + i, 300 + i, 400 + i],
            sampling=Sampling(max_new_tokens=2, temperature=0),
        )
        for i in range(32)
    ]
    cached: dict[str, int] = {}
    for r in reqs:
        scheduler.handle(r)
    while scheduler.has_work:
        for o in scheduler.step():
            cached[o.rid] = o.meta.cached_tokens
    assert sum(cached.values()) >= 0.95 * 31 * 800
    assert scheduler.stats.forward_tokens < 800 + 32 * 10


def test_prefill_only_request_caches_prompt(tiny_llama):
    scheduler = make_scheduler(tiny_llama)
    prompt = list(range(500, 700))
    run(scheduler, [GenerateReq(rid="a", input_ids=prompt, sampling=Sampling(max_new_tokens=0))])
    assert scheduler.cache.evictable == len(prompt)
    scheduler.handle(
        GenerateReq(rid="b", input_ids=prompt + [5], sampling=Sampling(max_new_tokens=1))
    )
    out = scheduler.step()
    assert out[0].meta.cached_tokens == len(prompt)


def test_stress_random_lengths_and_aborts(tiny_llama):
    """200 requests on a small pool, a fifth aborted at random moments: all end, nothing leaks."""
    rng = random.Random(7)
    scheduler = make_scheduler(
        tiny_llama, max_total_tokens=700, chunked_prefill_size=48, max_running_requests=24
    )
    reqs = [
        GenerateReq(
            rid=f"s{i}",
            input_ids=[rng.randrange(100, 40000) for _ in range(rng.randint(1, 150))],
            sampling=Sampling(max_new_tokens=rng.randint(1, 40), temperature=1.0),
        )
        for i in range(200)
    ]
    to_abort = set(rng.sample([r.rid for r in reqs], 40))
    done: dict[str, dict] = {}
    pending = list(reqs)
    for _ in range(20000):
        while pending and rng.random() < 0.5:
            scheduler.handle(pending.pop(0))
        if to_abort and rng.random() < 0.1:
            scheduler.handle(AbortReq(rng.choice(sorted(to_abort))))
        for o in scheduler.step():
            if o.finish is not None:
                assert o.rid not in done
                done[o.rid] = o.finish
        to_abort -= set(done)
        if not pending and not scheduler.has_work:
            break
    assert set(done) == {r.rid for r in reqs}
    assert any(f.kind is FinishKind.ABORT for f in done.values())
    scheduler.cache.check_idle()
    scheduler.cache.flush()
    assert scheduler.cache.allocator.available == scheduler.cache.allocator.size
