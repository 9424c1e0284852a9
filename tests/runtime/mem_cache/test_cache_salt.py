"""``cache_salt``: requests share cached prefixes only with requests of the same salt."""

from __future__ import annotations

from radixlm.runtime.scheduler.req import salt_offset

PROMPT = "The same long system prompt for every tenant. " * 12
GREEDY = {"max_new_tokens": 4, "temperature": 0}


def cached(engine, salt: str | None) -> int:
    kw = {} if salt is None else {"cache_salt": salt}
    return engine.generate(PROMPT, GREEDY, **kw)["meta_info"]["cached_tokens"]


def test_different_salts_never_share_and_the_same_salt_does(tiny_engine):
    tiny_engine.flush_cache()
    assert cached(tiny_engine, "tenant-a") == 0
    assert cached(tiny_engine, "tenant-b") == 0  # NOTE: same prompt, other tenant: no hit
    assert cached(tiny_engine, None) == 0  # unsalted requests are their own namespace
    assert cached(tiny_engine, "tenant-a") > 0
    assert cached(tiny_engine, None) > 0


def test_salt_offsets_fit_int64():
    assert salt_offset(None) == 0
    assert salt_offset("a") != salt_offset("b") and salt_offset("a") % (1 << 32) == 0
    assert all(0 < salt_offset(str(i)) + (1 << 32) <= 2**63 - 1 for i in range(1000))


def test_salt_does_not_change_greedy_output(tiny_engine):
    plain = tiny_engine.generate(PROMPT, GREEDY)["text"]
    assert tiny_engine.generate(PROMPT, GREEDY, cache_salt="x")["text"] == plain
