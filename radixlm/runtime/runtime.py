"""A running runtime: the child processes plus the tokenizer manager, used by the Engine and the
HTTP server alike."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from radixlm.runtime import threads
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.io_struct import EncodeInput, GenerateInput
from radixlm.runtime.launcher import Backend, rss_bytes
from radixlm.runtime.loader.model_files import load_config, load_tokenizer
from radixlm.runtime.loader.text_tokenizer import load_text_tokenizer
from radixlm.runtime.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)


class Runtime:
    def __init__(self, args: ServerArgs, backend: Backend, manager: TokenizerManager) -> None:
        self.args = args
        self.backend = backend
        self.manager = manager
        self.tokenizer = manager.tokenizer
        self._watch = None
        if backend.watched:
            self._watch = asyncio.get_running_loop().create_task(self._watchdog())

    @classmethod
    def start(cls, args: ServerArgs, backend: Backend, hf_tokenizer: bool = False) -> Runtime:
        """Call on the loop that will serve requests, after ``launch``: the scheduler has saved
        the torch-free tokenizer by then. ``hf_tokenizer``: hold transformers' tokenizer
        instead (the Engine's users get its whole API)."""
        _, path, fmt = load_config(args)
        load = load_tokenizer if hf_tokenizer else load_text_tokenizer
        tokenizer = load(args, path, fmt)
        manager = backend.manager(tokenizer)
        manager.start()
        return cls(args, backend, manager)

    async def _watchdog(self) -> None:
        """Fail every request once a child process died, or once the scheduler has not answered
        a ping for ``watchdog_timeout`` seconds (it answers between steps: a step that long is
        hung). The server then reports 503 and exits, as for a dead scheduler."""
        ping: asyncio.Task | None = None
        sent = 0.0
        try:
            while True:
                await asyncio.sleep(0.5)
                reason = self.backend.dead_reason() or self._hung(ping, sent)
                if reason:
                    logger.error("%s; failing requests in flight", reason)
                    self.manager.fail_all(reason)
                    return
                if ping is None or ping.done():
                    ping, sent = asyncio.ensure_future(self._ping()), time.monotonic()
        finally:
            if ping is not None:
                ping.cancel()

    async def _ping(self) -> None:
        """Ping the scheduler; at most one ping a second."""
        start = time.monotonic()
        with contextlib.suppress(Exception):
            await self.manager.control("ping", timeout=self.args.watchdog_timeout + 60)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - start)))

    def _hung(self, ping: asyncio.Task | None, sent: float) -> str | None:
        waited = time.monotonic() - sent
        if ping is None or ping.done() or self.manager.dead or waited <= self.args.watchdog_timeout:
            return None
        return f"the scheduler is hung: no step finished in {waited:.0f} s (--watchdog-timeout)"

    @property
    def alive(self) -> bool:
        return self.manager.dead is None and self.backend.dead_reason() is None

    async def generate(self, obj: GenerateInput | EncodeInput) -> dict | list[dict]:
        reqs = obj.split()
        results = await asyncio.gather(*(self.manager.generate_one(r) for r in reqs))
        return list(results) if obj.is_batch or len(results) > 1 else results[0]

    async def stream(self, obj: GenerateInput, incremental: bool = True) -> AsyncIterator[dict]:
        """Chunks of one request; ``incremental`` chunks carry only the new text and ids."""
        reqs = obj.split()
        if len(reqs) != 1:
            raise ValueError("streaming supports a single prompt with n=1")
        delta = Delta()
        async for chunk in self.manager.generate(reqs[0]):
            yield delta(chunk) if incremental else chunk

    async def flush_cache(self, tiers: tuple[str, ...] = ("memory",)) -> bool:
        """Empty the radix tree (``memory``; False while requests run) and/or the disk tier."""
        if "disk" in tiers and not (await self.manager.control("flush_disk_cache")).ok:
            return False
        return "memory" not in tiers or (await self.manager.control("flush_cache")).ok

    async def server_info(self) -> dict[str, Any]:
        stats = (await self.manager.control("stats")).data
        return {
            **{k: v for k, v in dataclasses.asdict(self.args).items() if k != "api_key"},
            **self.backend.info,
            "max_total_tokens": self.backend.info["max_total_tokens"],
            "threads": {**self.backend.info["threads"], "server": threads.torch_threads()},
            "rss_bytes": {
                **getattr(self.backend, "rss_bytes", dict)(),
                "server": rss_bytes(os.getpid()),
            },
            "stats": stats,
            "lora_adapters": getattr(self.manager, "loras", None),
        }

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self.manager.close()
        await asyncio.get_running_loop().run_in_executor(None, self.backend.shutdown)


class Delta:
    """Each chunk of one stream cut to the text and output ids it adds to those before it."""

    def __init__(self) -> None:
        self.text = self.ids = 0

    def __call__(self, chunk: dict) -> dict:
        text, ids = chunk["text"], chunk["output_ids"]
        out = {**chunk, "text": text[self.text :], "output_ids": ids[self.ids :]}
        self.text, self.ids = len(text), len(ids)
        return out
