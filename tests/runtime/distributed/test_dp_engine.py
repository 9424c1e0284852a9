"""Data parallelism through the Engine: two replicas of the tiny model behind the router."""

from __future__ import annotations

import random
import time

import pytest

from radixlm import Engine
from radixlm.runtime.tokenizer_manager import EngineDeadError
from tests.conftest import assert_no_leak

GROUPS, ROUNDS, PREFIX = 3, 3, 64


def prompt(group: int, i: int) -> list[int]:
    rng = random.Random(group)
    return [rng.randrange(100, 40_000) for _ in range(PREFIX)] + [7 + i, 9 + i, 11 + i, 13 + i]


def run_rounds(engine: Engine) -> dict[int, set[int]]:
    """Each round sends one request per prefix group, together; returns group -> replicas."""
    homes: dict[int, set[int]] = {}
    for r in range(ROUNDS):
        outs = engine.generate(
            input_ids=[prompt(g, r) for g in range(GROUPS)],
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        )
        for g, out in enumerate(outs):
            homes.setdefault(g, set()).add(out["meta_info"]["replica"])
    return homes


def replica_hit_rate(engine: Engine) -> float:
    replicas = engine.get_server_info()["stats"]["replicas"]
    assert len(replicas) == 2
    return sum(r["hit_tokens"] for r in replicas) / sum(r["queried_tokens"] for r in replicas)


def dp_engine(path: str, policy: str) -> Engine:
    return Engine(
        path, dtype="float32", dp_size=2, load_balance_method=policy, max_total_tokens=2048
    )


@pytest.fixture(scope="module")
def cache_aware_run(tiny_llama):
    with dp_engine(tiny_llama, "cache_aware") as engine:
        homes = run_rounds(engine)
        rate = replica_hit_rate(engine)
        assert_no_leak(engine)
    return rate, homes


@pytest.fixture(scope="module")
def round_robin_engine(tiny_llama):
    with dp_engine(tiny_llama, "round_robin") as engine:
        yield engine


def test_requests_sharing_a_prefix_land_on_one_replica(cache_aware_run):
    _, homes = cache_aware_run
    assert all(len(replicas) == 1 for replicas in homes.values()), homes
    assert set().union(*homes.values()) == {0, 1}


def test_cache_aware_hit_rate_is_well_above_round_robin(cache_aware_run, round_robin_engine):
    homes = run_rounds(round_robin_engine)
    assert any(len(replicas) == 2 for replicas in homes.values())
    round_robin = replica_hit_rate(round_robin_engine)
    assert cache_aware_run[0] >= 1.5 * round_robin > 0
    assert_no_leak(round_robin_engine)


def test_dead_replica_is_reported(round_robin_engine):
    round_robin_engine.runtime.backend.replicas[1].procs["scheduler"].kill()
    deadline = time.monotonic() + 30
    with pytest.raises(EngineDeadError, match="replica 1"):
        while time.monotonic() < deadline:
            round_robin_engine.get_server_info()
            time.sleep(0.2)
