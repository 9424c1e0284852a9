"""KV-cache events: what was published (stored minus removed) always equals the whole blocks of
the paths the radix tree holds, in vLLM's wire format."""

from __future__ import annotations

import random
import time

import msgspec
import torch
import zmq

from radixlm.runtime.mem_cache.kv_events import (
    TOPIC,
    AllBlocksCleared,
    KVEventPublisher,
    block_hashes,
)
from radixlm.runtime.mem_cache.radix_cache import RadixCache

BLOCK = 4


class Subscriber:
    def __init__(self, endpoint: str) -> None:
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.connect(endpoint)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.2)  # NOTE: PUB drops messages until the subscription has arrived
        self.seq = -1

    def events(self) -> list:
        out = []
        while self.socket.poll(50):
            topic, seq, payload = self.socket.recv_multipart()
            assert topic == TOPIC and int.from_bytes(seq, "big") == self.seq + 1
            self.seq += 1
            ts, events = msgspec.msgpack.decode(payload)
            assert ts > 0
            out.extend(events)
        return out


def held_blocks(tree: RadixCache) -> set[int]:
    """The whole blocks of every path the tree holds, hashed independently of the publisher."""
    out: set[int] = set()
    for leaf in tree._leaves:
        out.update(block_hashes(tree._path(leaf), BLOCK))
    return out


def apply(events: list, published: set[int]) -> None:
    for event in events:
        kind = event[0]
        if kind == "BlockStored":
            _, hashes, parent, tokens, size, lora, medium = event
            assert size == BLOCK and len(tokens) == BLOCK * len(hashes) and lora is None
            assert parent is None or parent in published
            assert not published & set(hashes), "stored twice"
            published.update(hashes)
        elif kind == "BlockRemoved":
            assert set(event[1]) <= published, "removed a block never stored"
            published.difference_update(event[1])
        else:
            assert event == ["AllBlocksCleared"]
            published.clear()


def test_published_blocks_track_the_tree_through_inserts_evictions_and_a_flush():
    endpoint = "inproc://kv-events-test"
    publisher = KVEventPublisher(endpoint, BLOCK)
    sub = Subscriber(endpoint)
    tree = RadixCache(1, publisher)
    rng = random.Random(0)
    published: set[int] = set()
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(3, 12))] for _ in range(4)]
    for step in range(60):
        if step % 7 == 6:
            tree.evict(rng.randrange(1, 30))
        else:
            key = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 14))]
            tree.insert(key, torch.arange(len(key)))
        publisher.flush()
        apply(sub.events(), published)
        assert published == held_blocks(tree), step
    tree.reset()
    publisher.flush()
    events = sub.events()
    assert events[-1] == ["AllBlocksCleared"]
    apply(events, published)
    assert not published
    publisher.close()


def test_stored_event_names_its_parent_and_only_the_new_whole_blocks():
    publisher = KVEventPublisher("inproc://kv-events-parent", BLOCK)
    tree = RadixCache(1, publisher)
    tree.insert(list(range(10)), torch.arange(10))  # blocks 0-3, 4-7
    tree.insert(list(range(6)) + [99] * 6, torch.arange(12))  # differs inside block 1
    cleared, first, second = publisher.pending  # NOTE: a new tree starts with a clear
    assert isinstance(cleared, AllBlocksCleared)
    assert first.parent_block_hash is None and len(first.block_hashes) == 2
    assert second.parent_block_hash == first.block_hashes[0]
    assert second.token_ids == [4, 5, 99, 99, 99, 99, 99, 99] and len(second.block_hashes) == 2
    publisher.close()
