"""The disk tier under the radix tree: same greedy output with it on and off, prefixes that
survive a restart, and block files that are corrupt, truncated or foreign never served."""

from __future__ import annotations

import os
import random
import shutil

import pytest

from radixlm import Engine
from radixlm.runtime.mem_cache.disk_store import DiskStore, block_hashes, model_key
from tests.conftest import assert_no_leak

BLOCK = 16
GREEDY = {"max_new_tokens": 8, "temperature": 0}


def prompts(n: int, words: int = 120, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    vocab = "alpha beta gamma delta river stone cloud light north south paper glass".split()
    heads = [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(3)]
    return [f"{heads[i % 3]} question {i}?" for i in range(n)]


def engine(path: str, tmp_path, **kw) -> Engine:
    return Engine(path, dtype="float32", max_total_tokens=kw.pop("max_total_tokens", 4096),
                  kv_disk_block_size=BLOCK, num_threads=1, **kw)  # fmt: skip


# -- the store -----------------------------------------------------------------------------


def test_blocks_round_trip_and_survive_a_new_store(tmp_path):
    ids = list(range(40))
    store = DiskStore(str(tmp_path), model_key("m"), budget=1 << 20)
    hashes = block_hashes(ids, BLOCK)
    assert len(hashes) == 2 and len(set(hashes)) == 2
    store.put(hashes[0], ids[:16], b"k" * 100)
    store.put(hashes[1], ids[16:32], b"v" * 100)
    store.close()
    again = DiskStore(str(tmp_path), model_key("m"), budget=1 << 20)
    assert again.get(hashes[1], ids[16:32]) == b"v" * 100
    assert again.get(hashes[1], ids[:16]) is None  # other ids: never served
    assert DiskStore(str(tmp_path), model_key("other"), 1 << 20).get(hashes[0], ids[:16]) is None


def test_hash_chains_name_the_whole_prefix():
    a, b = list(range(32)), [99, *range(1, 32)]
    assert block_hashes(a, BLOCK)[1] != block_hashes(b, BLOCK)[1]  # same second block


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_damaged_files_are_skipped_and_deleted(tmp_path, damage, caplog):
    ids = list(range(16))
    (h,) = block_hashes(ids, BLOCK)
    store = DiskStore(str(tmp_path), model_key("m"), budget=1 << 20)
    store.put(h, ids, bytes(range(256)) * 4)
    store.flush()
    path = store._path(h)
    data = bytearray(open(path, "rb").read())
    if damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[:-100]
    else:
        data[:8] = b"NOTKVBLK"
    open(path, "wb").write(bytes(data))
    assert store.get(h, ids) is None
    assert store.stats.rejected == 1 and not os.path.exists(path) and h not in store
    assert "skipping a corrupt" in caplog.text


def test_the_byte_budget_evicts_least_recently_used(tmp_path):
    store = DiskStore(str(tmp_path), model_key("m"), budget=3300)  # NOTE: 3 files of 1076 bytes
    ids = [[i] * BLOCK for i in range(4)]
    hashes = [block_hashes(x, BLOCK)[0] for x in ids]
    for x, h in zip(ids[:3], hashes[:3]):
        store.put(h, x, b"x" * 900)
    store.flush()
    store.get(hashes[0], ids[0])  # now the most recently used
    store.put(hashes[3], ids[3], b"x" * 900)
    store.flush()
    assert store.bytes_used <= 3300 and len(store) == 3
    assert hashes[1] not in store and all(hashes[i] in store for i in (0, 2, 3))
    assert len(os.listdir(store.dir)) == len(store)


def test_pinned_blocks_outlive_the_budget_and_a_restart_until_a_flush(tmp_path):
    ids = [[i] * BLOCK for i in range(4)]
    hashes = [block_hashes(x, BLOCK)[0] for x in ids]
    store = DiskStore(str(tmp_path), model_key("m"), budget=2200)  # NOTE: 2 files of 1076 bytes
    store.put(hashes[0], ids[0], b"x" * 900)
    store.flush()
    store.pin([hashes[0]])
    for x, h in zip(ids[1:], hashes[1:]):
        store.put(h, x, b"x" * 900)
        store.flush()
    assert hashes[0] in store and hashes[3] in store and hashes[1] not in store
    store.close()
    again = DiskStore(str(tmp_path), model_key("m"), budget=1100)
    again.put(block_hashes([7] * BLOCK, BLOCK)[0], [7] * BLOCK, b"x" * 900)
    again.flush()
    assert hashes[0] in again  # still pinned after the restart
    again.clear()
    assert len(again) == 0 and os.listdir(again.dir) == []


# -- the engine ----------------------------------------------------------------------------


def test_greedy_output_is_the_same_with_the_disk_tier_through_evictions(tiny_llama, tmp_path):
    batch = prompts(12, words=300)
    # NOTE: 3 prefixes of ~300 tokens in a 700-token pool: two fit, so every turn
    # evicts another head, which comes back from disk
    with engine(tiny_llama, tmp_path, max_total_tokens=700) as plain:
        want = [plain.generate(p, GREEDY)["text"] for p in batch]
    with engine(tiny_llama, tmp_path, max_total_tokens=700,
                kv_disk_cache=str(tmp_path / "kv")) as tiered:  # fmt: skip
        outs = [tiered.generate(p, GREEDY) for p in batch]
        stats = tiered.get_server_info()["stats"]
        assert_no_leak(tiered)
    assert [o["text"] for o in outs] == want
    assert stats["disk_hit_tokens"] > 0 and stats["disk_bytes_written"] > 0
    assert sum(o["meta_info"]["cached_tokens"] for o in outs[3:]) > 0


def test_a_restarted_engine_serves_a_known_prefix_from_disk(tiny_llama, tmp_path):
    prompt = prompts(1, words=400)[0]
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(tmp_path / "kv")) as first:
        before = first.generate(prompt, GREEDY)
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(tmp_path / "kv")) as second:
        after = second.generate(prompt, GREEDY)
        assert_no_leak(second)
    meta = after["meta_info"]
    assert after["text"] == before["text"]
    assert meta["cached_tokens"] >= 0.9 * meta["prompt_tokens"], meta


def test_tensor_parallel_ranks_keep_their_shards_and_agree_on_loads(tiny_llama, tmp_path):
    """tp=2: each rank saves its own shard's blocks (a directory each) and a restart loads
    them on both; when one rank lacks the blocks, neither loads them (the same text,
    recomputed)."""
    prompt = prompts(1, words=300)[0]
    kv, backup = tmp_path / "kv", tmp_path / "backup"
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(kv), tp_size=2) as first:
        want = first.generate(prompt, GREEDY)
    shards = sorted(d for d in kv.iterdir() if d.is_dir())
    assert len(shards) == 2 and all(any(d.glob("*.kv")) for d in shards)
    shutil.copytree(kv, backup)
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(kv), tp_size=2) as second:
        got = second.generate(prompt, GREEDY)
        assert_no_leak(second)
    assert got["text"] == want["text"]
    assert got["meta_info"]["cached_tokens"] >= 0.9 * got["meta_info"]["prompt_tokens"]
    for lost in range(2):  # NOTE: one of them is rank 1's, whose loss rank 0 cannot see
        shutil.rmtree(kv)
        shutil.copytree(backup, kv)
        for f in (kv / shards[lost].name).glob("*.kv"):
            f.unlink()
        with engine(tiny_llama, tmp_path, kv_disk_cache=str(kv), tp_size=2) as third:
            got = third.generate(prompt, GREEDY)
            assert_no_leak(third)
        assert got["text"] == want["text"] and got["meta_info"]["cached_tokens"] == 0, lost


def test_corrupt_blocks_are_recomputed_after_a_restart(tiny_llama, tmp_path):
    prompt = prompts(1, words=200)[0]
    kv = tmp_path / "kv"
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(kv)) as first:
        before = first.generate(prompt, GREEDY)
    files = [os.path.join(d, f) for d, _, fs in os.walk(kv) for f in fs]
    assert files
    for path in files:
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x55
        open(path, "wb").write(bytes(data))
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(kv)) as second:
        after = second.generate(prompt, GREEDY)
        stats = second.get_server_info()["stats"]
    assert after["text"] == before["text"]
    assert after["meta_info"]["cached_tokens"] == 0
    assert stats["disk_rejected_blocks"] == 1  # NOTE: the first bad block ends the lookup


def test_disk_usage_stays_in_budget(tiny_llama, tmp_path):
    with engine(tiny_llama, tmp_path, kv_disk_cache=str(tmp_path / "kv"),
                kv_disk_cache_size="200KB") as e:  # fmt: skip
        for p in prompts(6, words=150, seed=3):
            e.generate(p, GREEDY)
        stats = e.get_server_info()["stats"]
    assert 0 < stats["disk_bytes"] <= 200 * 1024
    assert stats["disk_bytes_written"] > 200 * 1024  # NOTE: it wrote more than it kept


@pytest.mark.parametrize("kw, message", [
    ({"kv_disk_cache_size": "lots"}, "kv_disk_cache_size must be a size"),
    ({"kv_disk_cache": "/tmp/x", "disable_radix_cache": True}, "needs the radix cache"),
    ({"kv_disk_cache": "/tmp/x", "page_size": 5}, "multiple of page_size"),
])  # fmt: skip
def test_bad_disk_cache_options_name_the_field(kw, message):
    from radixlm.runtime.config import ServerArgs

    with pytest.raises(ValueError, match=message):
        ServerArgs(**kw)


def test_loads_are_skipped_where_recomputing_has_been_faster():
    from radixlm.runtime.mem_cache.disk_tier import Costs

    costs = Costs()
    assert costs.worth_loading(100)  # NOTE: nothing measured yet: load
    costs.loaded(100, 0.5)
    assert costs.worth_loading(100)  # NOTE: prefill speed still unknown
    costs.prefilled(10, 0.0001)  # NOTE: too few tokens to measure prefill by
    assert costs.prefill_s_per_token is None
    costs.prefilled(200, 0.2)  # 1 ms a token, against 5 ms a token to load
    decisions = [costs.worth_loading(100) for _ in range(Costs.PROBE_EVERY)]
    assert decisions == [False] * (Costs.PROBE_EVERY - 1) + [True]  # NOTE: a probe keeps it fresh
    assert costs.skipped_tokens == 100 * (Costs.PROBE_EVERY - 1)
    for _ in range(20):
        costs.loaded(100, 0.01)  # the disk got faster: 0.1 ms a token
    assert costs.worth_loading(100)
