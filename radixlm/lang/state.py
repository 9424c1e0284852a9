"""ProgramState (the ``s`` of a program) and ProgramStateGroup (the result of ``s.fork``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixlm.lang.executor import StreamExecutor
from radixlm.lang.ir import (
    SglConcateAndAppend,
    SglExpr,
    SglExprList,
    SglRoleBegin,
    SglRoleEnd,
    SglVarScopeBegin,
    SglVarScopeEnd,
    as_expr,
)

if TYPE_CHECKING:
    from typing_extensions import Self


class RoleMixin:
    """``s.user(expr)`` appends a whole message; ``with s.user(): ...`` wraps what is appended
    inside the block. Shared by running and tracing states."""

    def _submit(self, expr: SglExpr) -> None:
        raise NotImplementedError

    def _role_common(self, name: str, expr: Any = None):
        if expr is not None:
            self._submit(SglExprList([SglRoleBegin(name), as_expr(expr), SglRoleEnd(name)]))
            return None
        return self._scope(SglRoleBegin(name), SglRoleEnd(name))

    @contextmanager
    def _scope(self, begin: SglExpr, end: SglExpr) -> Iterator[None]:
        self._submit(begin)
        yield
        self._submit(end)

    def system(self, expr: Any = None):
        return self._role_common("system", expr)

    def user(self, expr: Any = None):
        return self._role_common("user", expr)

    def assistant(self, expr: Any = None):
        return self._role_common("assistant", expr)

    def var_scope(self, name: str):
        """``with s.var_scope("x"): ...`` stores the text appended inside the block as ``x``."""
        return self._scope(SglVarScopeBegin(name), SglVarScopeEnd(name))


class ProgramState(RoleMixin):
    """The state a program appends to: ``s += "text"``, ``s += gen("x")``, ``s["x"]``."""

    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    def _submit(self, expr: SglExpr | str) -> None:
        self.stream_executor.submit(expr)

    def __iadd__(self, other: Any) -> Self:
        if other is None:
            raise ValueError("cannot append None to a program state")
        self._submit(other)
        return self

    def __getitem__(self, name: Any) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: Any, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: Any) -> bool:
        return name in self.stream_executor.variables

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    def get_var(self, name: Any) -> Any:
        """The value of variable ``name``; waits for it; raises ProgramError if the program
        failed before producing it."""
        return self.stream_executor.get_var(name)

    def set_var(self, name: Any, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: Any) -> Any:
        """The runtime's meta info for variable ``name`` (for ``select``: the choice scores)."""
        return self.stream_executor.get_meta_info(name)

    def tool_calls(self, name: Any) -> list[dict[str, Any]]:
        """The calls a ``gen(name, tools=...)`` made: ``{"name", "arguments"}`` dicts."""
        meta = self.get_meta_info(name) or {}
        return list(meta.get("tool_calls", [])) if isinstance(meta, dict) else []

    def text(self) -> str:
        return self.stream_executor.text()

    def messages(self) -> list[dict[str, str]]:
        """The conversation so far as OpenAI-style ``{"role", "content"}`` messages."""
        return self.stream_executor.messages()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        """The exception that stopped the program, or ``None``."""
        return self.stream_executor.error()

    def fork(self, size: int = 1) -> ProgramStateGroup:
        """``size`` branches that continue from here; their gens run concurrently."""
        states = [ProgramState(exe) for exe in self.stream_executor.fork(size)]
        return ProgramStateGroup(states, self)

    @contextmanager
    def copy(self) -> Iterator[ProgramState]:
        """``with s.copy() as c: ...``: one branch, joined when the block ends."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def _join_branches(self, branches: list[ProgramState], mode: str) -> None:
        parent = self.stream_executor
        if mode == "concate_and_append":
            self += SglConcateAndAppend(branches)
            self.sync()
        known = set(parent.variables)
        for branch in branches:
            child = branch.stream_executor
            child.sync()
            if child.error_ is not None and parent.error_ is None:
                parent.fail(child.error_)
            if mode == "gather_variable":
                for name in child.variables.keys() - known:
                    parent.variables.setdefault(name, []).append(child.variables[name])
            child.end()

    # -- streaming -----------------------------------------------------------------------------

    def text_iter(self, var_name: Any = None, return_meta_data: bool = False) -> Iterator[Any]:
        """Yield text as it is produced: the whole text, or one variable's. Without
        ``stream=True`` it yields the final value once. With ``return_meta_data`` (and a
        variable) it yields ``(text, meta_info)``, as SGLang's: the meta's output logprob lists
        hold only the tokens new since the last chunk, ``output_token_logprobs_length`` counts
        them all."""
        exe = self.stream_executor
        if not exe.stream:
            if var_name is None:
                yield self.text()
            elif return_meta_data:
                yield str(self.get_var(var_name)), self.get_meta_info(var_name)
            else:
                yield str(self.get_var(var_name))
            return
        if var_name is None:
            yield from _follow(exe.stream_text_event, lambda: exe.text_, lambda: exe.is_finished)
            return
        event = self._wait_stream_var(var_name)
        if event is None:
            return
        chunks = _follow(event, lambda: str(exe.variables.get(var_name, "")),
                         lambda: exe.variable_event[var_name].is_set())  # fmt: skip
        if not return_meta_data:
            yield from chunks
            return
        sent = 0
        for chunk in chunks:
            meta = dict(exe.meta_info.get(var_name) or {})
            total = len(meta.get("output_token_logprobs") or [])
            for key in _INCREMENTAL_META:
                if meta.get(key) is not None:
                    meta[key] = meta[key][sent:]
            meta["output_token_logprobs_length"] = total
            sent = total
            yield chunk, meta

    async def text_async_iter(
        self, var_name: Any = None, return_meta_data: bool = False
    ) -> AsyncIterator[Any]:
        """``text_iter`` as an async iterator (event waits run in a thread)."""
        iterator = self.text_iter(var_name, return_meta_data)
        loop = asyncio.get_running_loop()
        done = object()
        while (chunk := await loop.run_in_executor(None, next, iterator, done)) is not done:
            yield chunk

    def _wait_stream_var(self, var_name: Any):
        exe = self.stream_executor
        while var_name not in exe.stream_var_event:
            if exe.is_finished:
                return None
            exe.stream_text_event.wait(0.05)
        return exe.stream_var_event[var_name]


_INCREMENTAL_META = ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")


def _follow(event, read: Callable[[], str], done: Callable[[], bool]) -> Iterator[str]:
    sent = 0
    while True:
        event.wait()
        event.clear()
        finished = done()
        text = read()
        if len(text) > sent:
            yield text[sent:]
            sent = len(text)
        if finished:
            return


class ProgramStateGroup:
    """The branches of a fork: ``forks[i]``, ``forks += lambda i: ...``, ``forks.join()``."""

    def __init__(self, states: list[Any], src_state: Any = None) -> None:
        self.states = states
        self.src_state = src_state

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.states)

    def __getitem__(self, i: int) -> Any:
        return self.states[i]

    def __setitem__(self, i: int, value: Any) -> None:
        if value is not self.states[i]:
            raise ValueError("fork branches cannot be replaced; use forks[i] += ...")

    def __iadd__(self, other: Any) -> Self:
        if callable(other) and not isinstance(other, SglExpr):
            values = [other(i) for i in range(len(self.states))]
        elif isinstance(other, (list, tuple)):
            values = list(other)
        else:
            values = [other] * len(self.states)
        for state, value in zip(self.states, values, strict=True):
            state += value
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for the branches. ``gather_variable``: each variable a branch created becomes a
        list (one value per branch) in the parent; ``concate_and_append``: the branches' new
        text is appended to the parent."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"unknown join mode {mode!r}")
        self.src_state._join_branches(self.states, mode)
