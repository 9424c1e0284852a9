"""The detokenizer process: token ids in, text out, never half a UTF-8 character.

Streaming requests get text every step; others only when they finish. Stop strings are trimmed
from the text (unless ``no_stop_trim``). Without a tokenizer (``skip_tokenizer_init``) the ids
pass through and the text stays empty.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from radixlm.runtime import ipc
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.messages import Batch, ControlOut, TextOut, TokenOut

logger = logging.getLogger(__name__)


@dataclass
class _State:
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters of text already emitted


class Detokenizer:
    def __init__(self, load_tokenizer: Callable[[], Any]) -> None:
        self._load_tokenizer = load_tokenizer
        self.states: dict[str, _State] = {}

    @functools.cached_property
    def tokenizer(self) -> Any:
        """Loaded at the first text to decode: by then the scheduler, ready before any output,
        has saved the torch-free tokenizer (``loader.text_tokenizer``) even on a first start."""
        return self._load_tokenizer()

    def process(self, out: TokenOut) -> TextOut:
        state = self.states.setdefault(out.rid, _State())
        state.ids.extend(out.new_ids)
        text = ""
        if (out.stream or out.finish is not None) and self.tokenizer is not None:
            text = self._delta(state, out)
        if out.finish is not None:
            del self.states[out.rid]
        return TextOut(out.rid, text, out.new_ids, out.finish, out.meta)

    def _delta(self, state: _State, out: TokenOut) -> str:
        full = self.tokenizer.decode(state.ids, skip_special_tokens=out.skip_special_tokens)
        if out.finish is not None:
            cut = out.finish.trim if out.finish.trim is not None else out.finish.matched
            if not out.no_stop_trim and isinstance(cut, str):
                idx = full.find(cut)
                full = full[:idx] if idx >= 0 else full
        else:
            full = full.rstrip("\ufffd")
            if out.stop and not out.no_stop_trim:
                full = full[: max(len(full) - max(len(s) for s in out.stop) + 1, state.sent)]
        delta = full[state.sent :]
        state.sent = max(state.sent, len(full))
        return delta


def run_detokenizer_process(args: ServerArgs, ports: ipc.PortArgs, ready_pipe) -> None:
    logging.basicConfig(
        level=args.log_level.upper(), format="[detokenizer] %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()
    try:
        from radixlm.runtime.loader.gguf_loader import release_gguf
        from radixlm.runtime.loader.model_files import load_config
        from radixlm.runtime.loader.text_tokenizer import load_text_tokenizer

        _, path, fmt = load_config(args)
        detok = Detokenizer(lambda: load_text_tokenizer(args, path, fmt))
        release_gguf()
        ctx = zmq.Context()
        inbox = ipc.pull(ctx, ports.detokenizer)
        outbox = ipc.push(ctx, ports.tokenizer)
    except Exception as e:  # noqa: BLE001  (reported to the parent)
        ready_pipe.send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return
    ready_pipe.send({"ok": True})
    while os.getppid() == parent:
        for msg in ipc.recv_all(inbox, 500):
            items = msg.items if isinstance(msg, Batch) else [msg]
            out = [detok.process(m) if isinstance(m, TokenOut) else m for m in items]
            ipc.send(outbox, Batch(items=[m for m in out if isinstance(m, (TextOut, ControlOut))]))
    ports.cleanup()  # NOTE: the parent is gone (maybe killed): nobody else removes the ipc dir
