"""N-gram speculative decoding: the same greedy tokens with it on and off, for plain, batched,
stop-string, grammar and logprob requests; drafts that are accepted; no KV slot leaked."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.runtime.messages import Sampling
from radixlm.runtime.scheduler.speculative import DraftState, NgramDrafter, SpecStats
from tests.conftest import assert_no_leak

# NOTE: repetitive prompts, so that drafts exist, and a tiny random model's greedy output
# falls into loops, so that drafts are accepted
PROMPTS = [
    "one two three four one two three four one two three",
    "the cat sat on the mat and the cat sat on the",
    "a b c d e f g a b c d e f g a b c",
    "red green blue red green blue red",
]


def test_the_drafter_proposes_what_followed_the_suffix_before():
    drafter = NgramDrafter(num_draft_tokens=4, n_max=3, n_min=2)
    state = DraftState(4)
    ids = [5, 6, 7, 8, 9, 5, 6, 7]
    assert drafter.propose(state, ids, 4) == [8, 9, 5, 6]  # after the earlier "5 6 7"
    assert drafter.propose(state, ids + [1, 2], 4) == []  # "7 1 2" / "1 2": never seen
    assert drafter.propose(DraftState(4), [1, 2, 3], 4) == []  # the suffix does not find itself
    ids = [1, 2, 3, 1, 2, 4, 1, 2]
    assert drafter.propose(DraftState(4), ids, 2) == [4, 1]  # the latest occurrence wins


def test_only_requests_on_raw_logits_draft():
    ok = NgramDrafter.eligible
    greedy = Sampling(temperature=0.0)
    assert ok(greedy, [], False, False) and ok(Sampling(temperature=0.7, top_k=5), [], False, False)
    assert not ok(Sampling(temperature=0.0, repetition_penalty=1.2), [], False, False)
    assert not ok(Sampling(frequency_penalty=0.5), [], False, False)
    assert not ok(Sampling(temperature=0.0, speculative=False), [], False, False)  # opted out
    assert not ok(greedy, [2], False, False)  # min_new_tokens bans EOS
    assert not ok(greedy, [], False, True)  # logprobs
    assert ok(greedy, [], True, False)  # a grammar: greedy requests only
    assert not ok(Sampling(temperature=0.7), [], True, False)


def test_draft_length_adapts_and_pauses_after_misses():
    state = DraftState(4)
    state.update(drafted=4, accepted=1, k_max=6)
    assert state.k == 2
    state.update(drafted=2, accepted=2, k_max=6)
    assert state.k == 3 and state.ready()
    state.update(drafted=3, accepted=0, k_max=6)
    assert state.ready()  # one miss: keep trying
    state.update(drafted=1, accepted=0, k_max=6)
    assert [state.ready() for _ in range(5)] == [False] * 4 + [True]
    state.update(drafted=1, accepted=0, k_max=6)
    assert sum(not state.ready() for _ in range(9)) == 8  # the pause doubles


@pytest.fixture(scope="module")
def engines(tiny_llama):
    common = {"dtype": "float32", "max_total_tokens": 4096, "num_threads": 1}
    with Engine(tiny_llama, **common) as plain, Engine(
        tiny_llama, speculative_algorithm="ngram", speculative_num_draft_tokens=5, **common
    ) as spec:
        yield plain, spec


def both(engines, *args, **kw):
    plain, spec = engines
    return plain.generate(*args, **kw), spec.generate(*args, **kw)


def test_greedy_outputs_are_identical_and_drafts_are_accepted(engines):
    params = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    for prompt in PROMPTS:  # one at a time: single-stream decode
        a, b = both(engines, prompt, params)
        assert a["output_ids"] == b["output_ids"], prompt
    a, b = both(engines, PROMPTS, params)  # batched
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    stats = engines[1].get_server_info()["stats"]
    assert stats["spec_accepted_tokens"] > 0 and stats["spec_steps"] > 0
    assert engines[1].get_server_info()["stats"]["generated_tokens"] > 0


def test_stops_grammar_and_logprobs_behave_as_without_speculation(engines):
    params = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    plain = engines[0].generate(PROMPTS[0], params)
    stop = plain["text"][len(plain["text"]) // 2 :][:3]
    mixed = [
        (PROMPTS[0], {**params, "stop": [stop]}),
        (PROMPTS[1], {**params, "max_new_tokens": 7}),
        (PROMPTS[2], {**params, "regex": "(ab|cd)+x"}),
        (PROMPTS[3], {**params, "stop_token_ids": [plain["output_ids"][5]]}),
    ]
    prompts, sampling = zip(*mixed)
    a, b = both(engines, list(prompts), list(sampling), return_logprob=True, top_logprobs_num=2)
    for x, y in zip(a, b):
        assert x["text"] == y["text"] and x["meta_info"]["finish_reason"] == \
            y["meta_info"]["finish_reason"]
    a, b = both(engines, PROMPTS[0], {**params, "stop": [stop]})
    assert a["text"] == b["text"] and a["meta_info"]["finish_reason"]["type"] == "stop"


def test_a_repeated_request_drafts_from_the_radix_tree(engines):
    prompt, params = "an unrepetitive prompt about zebras", {"max_new_tokens": 32, "temperature": 0}
    a, first = both(engines, prompt, params)
    before = engines[1].get_server_info()["stats"]
    again = engines[1].generate(prompt, params)
    after = engines[1].get_server_info()["stats"]
    drafted, accepted = (after[k] - before[k] for k in ("spec_draft_tokens",
                                                        "spec_accepted_tokens"))  # fmt: skip
    assert again["output_ids"] == first["output_ids"] == a["output_ids"]
    # NOTE: the first run's output is in the tree: every draft is right, and with 3 drafts and
    # the model's own token per step, three quarters of the tokens come from drafts
    assert accepted == drafted and accepted >= 0.6 * len(again["output_ids"]), (drafted, accepted)


@pytest.mark.parametrize("jump_forward", [True, False])
def test_grammar_requests_draft_and_keep_their_tokens(tiny_llama, jump_forward):
    """A greedy request with a regex drafts (its draft cut where the grammar forbids it): the
    same tokens as without speculation, and a repeat drafts its first run's answer from the
    tree and keeps it."""
    regex = r'\{"name": "(ab|cd|ef){2,12}", "tags": \["(x|y)+"(, "(x|y)+"){0,4}\]\}'
    params = {"max_new_tokens": 60, "temperature": 0, "regex": regex}
    common = {"dtype": "float32", "max_total_tokens": 4096, "num_threads": 1,
              "disable_jump_forward": not jump_forward}  # fmt: skip
    with Engine(tiny_llama, **common) as plain, Engine(
        tiny_llama, speculative_algorithm="ngram", **common
    ) as spec:
        for prompt in PROMPTS[:2]:
            want = plain.generate(prompt, params)
            assert spec.generate(prompt, params)["output_ids"] == want["output_ids"]
            before = spec.get_server_info()["stats"]
            again = spec.generate(prompt, params)
            after = spec.get_server_info()["stats"]
            assert again["output_ids"] == want["output_ids"]
            assert after["spec_accepted_tokens"] > before["spec_accepted_tokens"]
        assert_no_leak(spec)


def test_continuation_reads_the_tree_without_touching_it():
    import torch

    from radixlm.runtime.mem_cache.radix_cache import RadixCache

    tree = RadixCache()
    tree.insert([1, 2, 3, 4, 5, 6], torch.arange(6))
    tree.insert([1, 2, 7, 8], torch.arange(10, 14))
    assert tree.continuation([1, 2, 3], 2) == [4, 5]  # inside a node
    assert tree.continuation([1, 2], 3) == [7, 8]  # the most recent branch
    assert tree.continuation([1, 9], 3) == [] and tree.continuation([1, 2, 7, 8], 3) == []
    tree.check()


CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12}


def chi2_two_samples(a: dict, b: dict) -> tuple[float, int]:
    """Pearson's chi-square statistic that two samples share one categorical distribution."""
    keys = set(a) | set(b)
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for k in keys:
        pooled = (a.get(k, 0) + b.get(k, 0)) / (na + nb)
        for count, n in ((a.get(k, 0), na), (b.get(k, 0), nb)):
            stat += (count - n * pooled) ** 2 / (n * pooled)
    return stat, len(keys) - 1


def test_sampled_tokens_keep_their_distribution(engines):
    plain, spec = engines
    prompt = "one two three four one two three four one two"
    # NOTE: the greedy answer goes into both trees first, so the sampling requests draft it
    # from the tree: drafts are the most likely tokens, and accept/reject both happen
    greedy = {"max_new_tokens": 4, "temperature": 0}
    plain.generate(prompt, greedy), spec.generate(prompt, greedy)
    # NOTE: 4 at a time: drafting keeps a step within 8 tokens
    params = {"max_new_tokens": 3, "temperature": 1.0, "top_k": 2, "n": 4, "ignore_eos": True}
    before = spec.get_server_info()["stats"]
    counts = []
    for engine in (plain, spec):
        seen: dict = {}
        for _ in range(75):
            for out in engine.generate(prompt, params):
                key = tuple(out["output_ids"][1:3])  # NOTE: tokens 2 and 3 come from drafts
                seen[key] = seen.get(key, 0) + 1
        counts.append(seen)
    after = spec.get_server_info()["stats"]
    drafted = after["spec_draft_tokens"] - before["spec_draft_tokens"]
    accepted = after["spec_accepted_tokens"] - before["spec_accepted_tokens"]
    assert 0 < accepted < drafted  # both outcomes occurred
    stat, dof = chi2_two_samples(*counts)
    assert stat < CHI2_999[min(dof, 8)], (stat, dof, counts)


def test_a_request_can_opt_out(engines):
    spec = engines[1]
    before = spec.get_server_info()["stats"]["spec_steps"]
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True, "speculative": False}
    a, b = both(engines, PROMPTS[0], params)
    assert a["output_ids"] == b["output_ids"]
    assert spec.get_server_info()["stats"]["spec_steps"] == before
    with pytest.raises(ValueError, match="speculative"):
        spec.generate(PROMPTS[0], {"speculative": "no"})


def test_no_kv_slot_leaks_after_aborts(engines):
    spec = engines[1]
    params = {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True}
    for prompt in PROMPTS:
        for i, _ in enumerate(spec.generate(prompt, params, stream=True)):
            if i == 5:
                break  # closing the stream aborts the request
    spec.generate(PROMPTS, {**params, "max_new_tokens": 30})
    assert_no_leak(spec)
    assert_no_leak(engines[0])


def test_acceptance_lengths_are_a_prometheus_histogram():
    from prometheus_client.parser import text_string_to_metric_families

    from radixlm.server.metrics import ServerMetrics

    stats = SpecStats()
    for drafted, accepted in ((4, 0), (4, 2), (3, 2), (4, 4)):
        stats.record(drafted, accepted)
    text = ServerMetrics("m").render(stats.as_dict()).decode()
    family = next(f for f in text_string_to_metric_families(text)
                  if f.name == "radixlm:spec_decode_acceptance_length")  # fmt: skip
    samples = {(s.name.rsplit("_", 1)[-1], s.labels.get("le")): s.value for s in family.samples}
    assert samples[("bucket", "0.0")] == 1 and samples[("bucket", "1.0")] == 1
    assert samples[("bucket", "2.0")] == 3 and samples[("bucket", "+Inf")] == 4
    assert samples[("count", None)] == 4 and samples[("sum", None)] == 8
