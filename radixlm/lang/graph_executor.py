"""Running a compiled program's streams: a StreamExecutor that hands the values of variables
other streams read to those readers (``Slot``), captured as they are when produced."""

from __future__ import annotations

import threading
from typing import Any

from radixlm.lang.executor import ProgramError, StreamExecutor
from radixlm.lang.ir import SglExpr


class Capture(SglExpr):
    """Queued after an expression whose variable is read elsewhere: copies the value into
    ``slot`` as it is then, so that a later gen of the same name cannot change what is read."""

    def __init__(self, slot: Slot, key: Any) -> None:
        super().__init__()
        self.slot = slot
        self.key = key

    def __repr__(self) -> str:
        return f"Capture({self.key!r})"


class Slot:
    """One captured variable value; ``get_var`` (what an SglVariable's source provides) waits
    for it, and raises ProgramError if its stream failed first."""

    def __init__(self, name: Any) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def fill(self, value: Any, error: BaseException | None = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._value, self._error = value, error
            self._done.set()

    def get_var(self, name: Any) -> Any:
        self._done.wait()
        if self._error is not None:
            raise ProgramError(
                f"variable {name!r} is unavailable: the program failed with {self._error!r}"
            ) from self._error
        return self._value


class GraphExecutor(StreamExecutor):
    """A StreamExecutor that also fills the slots of the variables other nodes read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots: list[Slot] = []

    @property
    def ended(self) -> bool:
        return self._ended

    def capture(self, slot: Slot, key: Any) -> None:
        self._slots.append(slot)
        self.submit(Capture(slot, key))

    def _execute(self, expr: SglExpr) -> None:
        if isinstance(expr, Capture):
            expr.slot.fill(self.variables[expr.key])
        else:
            super()._execute(expr)

    def _release_events(self) -> None:
        super()._release_events()
        error = self.error_ or RuntimeError("the stream stopped")
        for slot in list(self._slots):
            slot.fill(None, error)
