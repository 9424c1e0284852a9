"""The request and response shapes shared by the Engine, ``/generate`` and the language backends."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

MAX_N = 128  # samples per prompt
MAX_REQUESTS = 1024  # requests per call (prompts x n)
POOLINGS = ("last", "mean")  # how an embedding is pooled (runtime/scheduler/pooling.py)


def check_pooling(pooling: object) -> str:
    """``pooling`` when it is one the engine computes; ValueError naming the field."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {list(POOLINGS)}, got {pooling!r}")
    return pooling  # type: ignore[return-value]


@dataclass
class SingleRequest:
    rid: str
    text: str | None
    input_ids: list[int] | None
    sampling: dict[str, Any]
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    group: str | None = None  # the rid of the ``n`` request this is a sample of
    cache_salt: str | None = None  # shares cached prefixes only with the same salt
    priority: int = 0  # with the "priority" schedule policy: lower is scheduled first
    lora_name: str | None = None  # a loaded LoRA adapter; None: the base model
    pooling: str | None = None  # an embedding request: "last" | "mean" (no output tokens)
    normalize: bool = True  # the embedding divided by its L2 norm
    token_ids_logprob: list[int] | None = None  # ids whose logprobs each output token reports


@dataclass
class GenerateInput:
    """``/generate``'s body: one prompt or a batch, as text or token ids."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    rid: str | list[str] | None = None
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    cache_salt: str | None = None
    priority: int = 0
    lora_path: str | list[str | None] | None = None  # SGLang's name: an adapter per prompt
    token_ids_logprob: list[int] | list[list[int]] | None = None  # one list, or one per prompt
    # SGLang's: CustomLogitProcessor.to_str() of the prompts' logit processor, or one per
    # prompt (a sampling parameter from here on; its arguments are "custom_params")
    custom_logit_processor: str | list[str | None] | None = None

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return not isinstance(self.text, str)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)

    def split(self) -> list[SingleRequest]:
        """One SingleRequest per prompt and per sample (``n``), validating the shapes."""
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("exactly one of text and input_ids must be given")
        prompts = self._prompts()
        params = self._per_prompt(self.sampling_params, len(prompts), "sampling_params", dict)
        rids = self._per_prompt(self.rid, len(prompts), "rid", str)
        loras = self._per_prompt(self.lora_path, len(prompts), "lora_path", str)
        id_lists = self._token_ids_logprob(len(prompts))
        procs = self._per_prompt(self.custom_logit_processor, len(prompts),
                                 "custom_logit_processor", str)  # fmt: skip
        out = []
        for prompt, p, rid, lora, ids, proc in zip(prompts, params, rids, loras, id_lists, procs):
            p = dict(p or {})
            if proc is not None:
                p["custom_logit_processor"] = proc
            n = p.pop("n", None)
            n = 1 if n is None else n
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
                raise ValueError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
            rid = rid or uuid.uuid4().hex
            for i in range(n):
                sp = dict(p)
                if n > 1 and sp.get("sampling_seed", sp.get("seed")) is not None:
                    sp["sampling_seed"] = sp.pop("sampling_seed", sp.pop("seed", 0)) + i
                single = self._single(prompt, sp, rid if n == 1 else f"{rid}-{i}")
                single.group = rid if n > 1 else None
                single.lora_name = lora
                single.token_ids_logprob = ids
                out.append(single)
        if len({r.rid for r in out}) < len(out):
            raise ValueError("rid must name each prompt once: give a list of distinct rids")
        if len(out) > MAX_REQUESTS:
            raise ValueError(
                f"the call makes {len(out)} requests (prompts x n); at most {MAX_REQUESTS}"
            )
        return out

    def _prompts(self) -> list[Any]:
        if self.text is not None:
            prompts = [self.text] if isinstance(self.text, str) else list(self.text)
            if not all(isinstance(t, str) for t in prompts):
                raise ValueError("text must be a string or a list of strings")
        else:
            prompts = self.input_ids if self.is_batch else [self.input_ids]
            if not all(isinstance(t, int) for ids in prompts for t in ids):
                raise ValueError("input_ids must be a list of ints or a list of such lists")
        if not prompts:
            raise ValueError("the batch is empty")
        return prompts

    def _token_ids_logprob(self, n: int) -> list[list[int] | None]:
        """One flat list of ids per prompt: a batch takes one list for all or a list per prompt;
        one prompt takes one flat list."""
        value = self.token_ids_logprob
        if value is None:
            return [None] * n
        flat = isinstance(value, list) and all(is_int(t) for t in value)
        nested = (isinstance(value, list) and len(value) == n and self.is_batch
                  and all(isinstance(v, list) and all(map(is_int, v)) for v in value))  # fmt: skip
        if flat:
            return [list(value)] * n
        if nested:
            return [list(v) for v in value]
        if not self.is_batch:
            raise ValueError("token_ids_logprob must be a flat list of integers for one prompt")
        raise ValueError(
            f"token_ids_logprob must be a flat list of integers or a list of {n} such lists"
        )

    @staticmethod
    def _per_prompt(value: Any, n: int, name: str, kind: type) -> list[Any]:
        if value is None or isinstance(value, kind):
            return [value] * n
        if isinstance(value, list) and len(value) == n:
            return value
        raise ValueError(f"{name} must be a {kind.__name__} or a list of {n} of them")

    def _single(self, prompt: Any, sampling: dict, rid: str) -> SingleRequest:
        is_text = isinstance(prompt, str)
        return SingleRequest(
            rid=rid,
            text=prompt if is_text else None,
            input_ids=None if is_text else list(prompt),
            sampling=sampling,
            stream=self.stream,
            return_logprob=self.return_logprob,
            logprob_start_len=self.logprob_start_len,
            top_logprobs_num=self.top_logprobs_num,
            return_text_in_logprobs=self.return_text_in_logprobs,
            cache_salt=self.cache_salt,
            priority=self.priority,
        )


@dataclass
class EncodeInput:
    """An embedding call (``Engine.encode``, ``/encode``, ``/v1/embeddings``): one input or a
    batch, as text or token ids, each answered with its pooled, by default normalised, hidden
    state (``runtime/scheduler/pooling.py``)."""

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    pooling: str = "last"
    normalize: bool = True
    rid: str | list[str] | None = None
    cache_salt: str | None = None
    lora_path: str | list[str | None] | None = None

    def _generate(self) -> GenerateInput:
        return GenerateInput(self.text, self.input_ids, None, self.rid,
                             cache_salt=self.cache_salt, lora_path=self.lora_path)  # fmt: skip

    @property
    def is_batch(self) -> bool:
        return self._generate().is_batch

    def split(self) -> list[SingleRequest]:
        """One SingleRequest per input, validating the shapes and the pooling."""
        check_pooling(self.pooling)
        reqs = self._generate().split()
        for req in reqs:
            req.pooling, req.normalize = self.pooling, self.normalize
        return reqs


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON true is not a token id)."""
    return isinstance(value, int) and not isinstance(value, bool)
