"""Engine: the in-process entry point, with the same request/response shapes as /generate."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.io_struct import EncodeInput, GenerateInput
from radixlm.runtime.launcher import launch
from radixlm.runtime.runtime import Runtime
from radixlm.runtime.scoring import ScoreInput


class Engine:
    """Generate from a model without HTTP.

    ``Engine(model_path=None, dtype="auto", **options)``: no path loads the embedded default
    (SmolLM2-135M-Instruct); options are the fields of ``ServerArgs``.
    """

    def __init__(self, model_path: str | None = None, dtype: str = "auto", **options: Any) -> None:
        self.server_args = ServerArgs.from_kwargs(model_path=model_path, dtype=dtype, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="radixlm-engine", daemon=True
        )
        self._thread.start()
        self._runtime: Runtime | None = None
        self._runtime = self._call(self._start())

    async def _start(self) -> Runtime:
        backend = await asyncio.get_running_loop().run_in_executor(None, launch, self.server_args)
        return Runtime.start(self.server_args, backend, hf_tokenizer=True)

    @property
    def tokenizer(self):
        return self.runtime.tokenizer

    @property
    def info(self) -> dict:
        return self.runtime.backend.info

    # -- generation -----------------------------------------------------------------------------

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        cache_salt: str | None = None,
        priority: int = 0,
        lora_path: str | list[str | None] | None = None,
        token_ids_logprob: list[int] | list[list[int]] | None = None,
        custom_logit_processor: str | list[str | None] | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """Generate for one prompt (a dict), a batch (a list), or stream one prompt's chunks.
        ``cache_salt``: share cached prefixes only with requests of the same salt.
        ``priority`` (with ``schedule_policy="priority"``): lower values are scheduled first.
        ``lora_path``: the name of a loaded LoRA adapter (or one per prompt; None: the base
        model). ``token_ids_logprob`` (with ``return_logprob``): the logprobs of these token ids
        at every output token, ``meta_info["output_token_ids_logprobs"]``.
        ``custom_logit_processor`` (with ``enable_custom_logit_processor``): a
        ``CustomLogitProcessor.to_str()``, given ``sampling_params["custom_params"]``."""
        obj = GenerateInput(
            prompt,
            input_ids,
            sampling_params,
            rid,
            stream,
            return_logprob,
            logprob_start_len,
            top_logprobs_num,
            return_text_in_logprobs,
            cache_salt,
            priority,
            lora_path,
            token_ids_logprob,
            custom_logit_processor,
        )
        if stream:
            return self._stream(obj)
        return self._call(self.runtime.generate(obj))

    def encode(
        self,
        prompt: str | list[str] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        pooling: str = "last",
        normalize: bool = True,
        rid: str | list[str] | None = None,
        cache_salt: str | None = None,
        lora_path: str | list[str | None] | None = None,
    ) -> dict | list[dict]:
        """Embed one input (a dict with ``embedding`` and ``meta_info``) or a batch (a list):
        the final-normed hidden state of the ``last`` token or the ``mean`` over all tokens,
        divided by its L2 norm unless ``normalize`` is False."""
        obj = EncodeInput(prompt, input_ids, pooling, normalize, rid, cache_salt, lora_path)
        return self._call(self.runtime.generate(obj))

    def score(
        self,
        query: str | list[int],
        items: str | list[str] | list[list[int]],
        label_token_ids: list[int],
        apply_softmax: bool = False,
        item_first: bool = False,
        lora_path: str | None = None,
    ) -> list[list[float]]:
        """SGLang's scoring: per item, the probability of each label token coming next after
        ``query + item`` (``item + query`` with ``item_first``), in ``label_token_ids`` order;
        ``apply_softmax`` normalises them over the labels. Items share the query's cached KV."""
        obj = ScoreInput(query, items, label_token_ids, apply_softmax, item_first,
                         lora_path=lora_path)  # fmt: skip
        gen = obj.generate_input(self.info["vocab_size"])
        return obj.scores(self._call(self.runtime.generate(gen)))

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, **kw):
        """Awaitable ``generate``; with ``stream=True`` returns an async iterator of chunks."""
        obj = GenerateInput(prompt, input_ids, sampling_params, **kw)
        if obj.stream:
            return self._async_stream(obj)
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(self.runtime.generate(obj), self._loop)
        )

    def _stream(self, obj: GenerateInput) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for chunk in self.runtime.stream(obj):
                    q.put(chunk)
            except Exception as e:  # noqa: BLE001  (re-raised in the caller's thread)
                q.put(e)
            q.put(done)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := q.get()) is not done:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            future.cancel()

    async def _async_stream(self, obj: GenerateInput) -> AsyncIterator[dict]:
        q: asyncio.Queue = asyncio.Queue()
        caller = asyncio.get_running_loop()

        async def pump() -> None:
            try:
                async for chunk in self.runtime.stream(obj):
                    caller.call_soon_threadsafe(q.put_nowait, chunk)
            except Exception as e:  # noqa: BLE001
                caller.call_soon_threadsafe(q.put_nowait, e)
            caller.call_soon_threadsafe(q.put_nowait, None)

        future = asyncio.run_coroutine_threadsafe(pump(), self._loop)
        try:
            while (item := await q.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            future.cancel()

    # -- control -------------------------------------------------------------------------------

    def abort_request(self, rid: str) -> None:
        """Abort a request by id, waiting or running; its caller gets finish_reason abort."""
        self._loop.call_soon_threadsafe(self.runtime.manager.abort, rid)

    def flush_cache(self) -> bool:
        return self._call(self.runtime.flush_cache())

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> None:
        """Serve the peft adapter at ``lora_path`` as ``lora_name`` (ValueError naming what is
        wrong with it); needs ``enable_lora=True`` or ``lora_paths``."""
        self._call(self.runtime.manager.load_lora(lora_name, lora_path))

    def unload_lora_adapter(self, lora_name: str) -> None:
        """Stop serving ``lora_name``: new requests cannot name it, running ones finish."""
        self._call(self.runtime.manager.unload_lora(lora_name))

    def get_server_info(self) -> dict:
        return self._call(self.runtime.server_info())

    def shutdown(self) -> None:
        """Stop the child processes and the event loop (idempotent)."""
        runtime, self._runtime = getattr(self, "_runtime", None), None
        if runtime is not None and self._loop.is_running():
            self._call(runtime.close(), timeout=30)
        elif runtime is not None:
            runtime.backend.shutdown()
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def _call(self, coro, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("the engine has been shut down")
        return self._runtime

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001
            pass
