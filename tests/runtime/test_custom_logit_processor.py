"""Custom logit processors (SGLang's): a client's class, sent as ``to_str()``, rewrites its own
rows' logits in a mixed batch; off unless enabled; a failing one fails only its requests."""

from __future__ import annotations

import pytest

from radixlm import Engine
from radixlm.runtime.sampling.custom_logit_processor import CustomLogitProcessor
from tests.conftest import assert_no_leak, force_token_processor

PROMPT = [11, 12, 13, 14]


def _processors() -> dict[str, str]:
    """Defined in a function, so dill pickles the classes by value (see
    ``force_token_processor``)."""

    class Count(CustomLogitProcessor):
        """The next token is 100 + the number of tokens so far (reads ``__req__``)."""

        def __call__(self, logits, custom_param_list=None):
            for i, params in enumerate(custom_param_list):
                req = params["__req__"]
                logits[i, 100 + len(req.origin_input_ids) + len(req.output_ids)] = 1e9
            return logits

    class Broken(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            raise RuntimeError("boom")

    return {"force": force_token_processor(), "count": Count.to_str(), "broken": Broken.to_str()}


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = Engine(tiny_llama, dtype="float32", max_total_tokens=2048,
                    enable_custom_logit_processor=True)  # fmt: skip
    yield engine
    engine.shutdown()


def test_processors_rewrite_only_their_rows_of_a_mixed_batch(engine):
    procs = _processors()
    greedy = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
    plain = engine.generate(input_ids=PROMPT, sampling_params=greedy)["output_ids"]
    obj = {"max_new_tokens": 4, "ignore_eos": True}  # NOTE: sampling too: the processor decides
    outs = [engine.generate(input_ids=PROMPT, custom_logit_processor=procs["force"],
                            sampling_params={**obj, "custom_params": {"token_id": t}})
            for t in (7, 9)]  # fmt: skip
    assert [o["output_ids"] for o in outs] == [[7] * 4, [9] * 4]
    batch = engine.generate(
        input_ids=[PROMPT] * 3,
        sampling_params=[{**obj, "custom_params": {"token_id": 7}}, greedy,
                         {**obj, "custom_params": {"token_id": 9}}],
        custom_logit_processor=[procs["force"], None, procs["force"]],
    )  # fmt: skip
    assert [b["output_ids"] for b in batch] == [[7] * 4, plain, [9] * 4]
    counted = engine.generate(input_ids=PROMPT, custom_logit_processor=procs["count"],
                              sampling_params=greedy)["output_ids"]  # fmt: skip
    assert counted == [104, 105, 106, 107]
    alone = engine.generate(input_ids=PROMPT, sampling_params=greedy)["output_ids"]
    assert alone == plain
    assert_no_leak(engine)


def test_a_failing_processor_fails_only_its_request(engine):
    procs = _processors()
    params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    with pytest.raises(ValueError, match="custom_logit_processor failed: RuntimeError: boom"):
        engine.generate(input_ids=PROMPT, sampling_params=params,
                        custom_logit_processor=procs["broken"])  # fmt: skip
    assert len(engine.generate(input_ids=PROMPT, sampling_params=params)["output_ids"]) == 3
    with pytest.raises(ValueError, match='JSON {"callable"'):
        engine.generate(input_ids=PROMPT, custom_logit_processor="not json")
    with pytest.raises(ValueError, match="custom_params must be an object"):
        engine.generate(input_ids=PROMPT, sampling_params={"custom_params": [1]})
    assert_no_leak(engine)


def test_processors_are_off_unless_enabled(tiny_engine):
    with pytest.raises(ValueError, match="--enable-custom-logit-processor"):
        tiny_engine.generate(input_ids=PROMPT, custom_logit_processor=_processors()["force"])
