"""Custom logit processors, as SGLang's: a client's own Python class that rewrites the logits of
its requests before sampling.

A client subclasses ``CustomLogitProcessor``, sends ``MyProcessor.to_str()`` as the request's
``custom_logit_processor`` and per-request arguments as ``sampling_params["custom_params"]``.
Each step, the rows of one processor are handed to it together: ``processor(logits [n, V],
custom_param_list)``, one dict per row, with the request under ``"__req__"`` (its
``origin_input_ids`` and ``output_ids``). It runs after penalties, logit bias and grammar masks,
before temperature, top-k/p and the choice.

The string is the class pickled with ``dill``: the server runs the client's code. It is off
unless the server starts with ``--enable-custom-logit-processor`` (``Engine(
enable_custom_logit_processor=True)``), for trusted clients only, as in SGLang.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch  # NOTE: only the scheduler runs processors; the server checks the string

MAX_PROCESSOR_CHARS = 1 << 20  # NOTE: a class, not a model: 1 MiB of hex is ample


class CustomLogitProcessor(ABC):
    """Subclass and implement ``__call__``; it may change ``logits`` in place or return new
    ones of the same shape."""

    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None
    ) -> torch.Tensor: ...

    @classmethod
    def to_str(cls) -> str:
        """The class as the string a request's ``custom_logit_processor`` carries. A class
        defined in a script's ``__main__``, a notebook or a function travels by value (with the
        globals its methods use); one importable from a module travels by reference, so the
        server must be able to import that module."""
        import dill

        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @classmethod
    def from_str(cls, text: str) -> CustomLogitProcessor:
        return load_processor(text)


def check_processor_text(text: object) -> str:
    """The shape of a ``custom_logit_processor`` string, checked without unpickling it (the
    server process never runs the client's code; the scheduler does)."""
    if not isinstance(text, str) or len(text) > MAX_PROCESSOR_CHARS:
        raise ValueError("custom_logit_processor must be the string CustomLogitProcessor.to_str() "
                         f"returns (at most {MAX_PROCESSOR_CHARS} characters)")  # fmt: skip
    try:
        hex_text = json.loads(text)["callable"]
        bytes.fromhex(hex_text)
    except (ValueError, KeyError, TypeError):
        message = ('custom_logit_processor must be JSON {"callable": "<hex of the dill-pickled '
                   'class>"}, as CustomLogitProcessor.to_str() writes it')  # fmt: skip
        raise ValueError(message) from None
    return text


def load_processor(text: str) -> CustomLogitProcessor:
    """A new instance of the class ``text`` holds (as SGLang, one per use: no state carries
    over from step to step)."""
    processor = _processor_class(text)()
    if not callable(processor):
        raise ValueError(f"custom_logit_processor: {type(processor)!r} instances are not callable")
    return processor


@lru_cache(maxsize=64)
def _processor_class(text: str) -> type:
    """The class ``text`` holds; each distinct string is unpickled once."""
    import dill

    return dill.loads(bytes.fromhex(json.loads(text)["callable"]))


def apply_processors(logits: torch.Tensor, rows: list[Any]) -> tuple[torch.Tensor, dict[int, str]]:
    """``logits`` with each row group's processor applied; a processor that fails (or returns
    the wrong shape) leaves its rows as they were and names the error, by row."""
    import torch

    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if row.params.custom_logit_processor is not None:
            groups.setdefault(row.params.custom_logit_processor, []).append(i)
    errors: dict[int, str] = {}
    for text, idx in groups.items():
        params = [{**(rows[i].params.custom_params or {}), "__req__": rows[i].req} for i in idx]
        index = torch.tensor(idx, device=logits.device)
        try:
            out = load_processor(text)(logits[index], params)
            if not isinstance(out, torch.Tensor) or out.shape != (len(idx), logits.shape[1]):
                raise ValueError(f"it returned {type(out).__name__} "
                                 f"{tuple(getattr(out, 'shape', ()))}, not the logits "
                                 f"[{len(idx)}, {logits.shape[1]}]")  # fmt: skip
            logits[index] = out.to(logits.dtype)
        except Exception as e:  # noqa: BLE001 - a client's code fails only its own requests
            errors.update({i: f"custom_logit_processor failed: {type(e).__name__}: {e}"
                           for i in idx})  # fmt: skip
    return logits, errors
