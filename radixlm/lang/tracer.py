"""Tracing: run a program's code on placeholders to build its expression graph.

``trace_program`` records every expression; ``extract_prefix_by_tracing`` stops at the first
expression that is not constant text and returns the constant prefix, which ``run_batch``
caches once before dispatching the batch. A trace for ``compile()`` (``compiling=True``) keeps
roles symbolic, so the compiled program renders them with the chat template of the backend it
runs on, and its placeholders refuse to stand in for values in Python code (``if``, ``==``,
f-strings), since the compiled graph could not reproduce what that code decides.
"""

from __future__ import annotations

import threading
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.ir import (
    SglArgument,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglFork,
    SglGen,
    SglGetForkItem,
    SglJoin,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    SglSeparateReasoning,
    SglVariable,
    SglVarScopeBegin,
    SglVarScopeEnd,
    as_expr,
)
from radixlm.lang.state import ProgramStateGroup, RoleMixin

if TYPE_CHECKING:
    from collections.abc import Iterator

    from typing_extensions import Self

    from radixlm.lang.function import SglFunction


class StopTracing(Exception):
    """Raised inside a prefix trace at the first expression that is not constant."""


# NOTE: the active tracer is per thread, so programs traced and run on other threads
# (run_batch) never see each other's scopes.
_scope = threading.local()


def current_tracer() -> TracerProgramState | None:
    return getattr(_scope, "tracer", None)


class TracingScope:
    """Within the block, calling an ``SglFunction`` traces it into ``tracer``."""

    def __init__(self, tracer: TracerProgramState) -> None:
        self.tracer = tracer

    def __enter__(self) -> Self:
        self._previous = current_tracer()
        _scope.tracer = self.tracer
        return self

    def __exit__(self, *exc: object) -> None:
        _scope.tracer = self._previous


class _ValueRefused:
    """Mixin of the placeholders of a ``compile()`` trace: they have no value yet, so Python
    code that would decide something from one (a condition, a comparison, an f-string, ``str``,
    a loop) fails here instead of tracing one arbitrary path."""

    def _refuse(self, use: str):
        raise TypeError(
            f"{self!r} has no value while the program is traced for compile(), so it cannot be "
            f"used {use}"
        )

    def __bool__(self) -> bool:
        self._refuse("as a condition")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SglExpr):
            return self is other
        self._refuse("in a comparison")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __format__(self, spec: str) -> str:
        self._refuse("in an f-string")

    def __str__(self) -> str:
        self._refuse("as a str")

    def __iter__(self) -> Iterator[Any]:
        self._refuse("as a sequence")

    def __len__(self) -> int:
        self._refuse("as a sequence")


class CompileArgument(_ValueRefused, SglArgument):
    """A program argument's placeholder in a ``compile()`` trace."""


class CompileVariable(_ValueRefused, SglVariable):
    """A variable read (``s["x"]``) in a ``compile()`` trace."""


def _placeholders(program: SglFunction, given: dict[str, Any],
                  compiling: bool = False) -> dict[str, Any]:
    kind = CompileArgument if compiling else SglArgument
    args = {name: kind(name) for name in program.arg_names if name not in given}
    return {**args, **given, **program.bind_arguments}


def trace_program(program: SglFunction, arguments: dict[str, Any],
                  backend: BaseBackend | None, compiling: bool = False) -> TracerProgramState:
    """Trace ``program``; unknown arguments are placeholders. A program called from the code of
    one being traced is traced as a stream of its own, listed in the caller's
    ``child_states``, and inherits ``compiling``."""
    caller = current_tracer()
    compiling = compiling or (caller is not None and caller.compiling)
    tracer = TracerProgramState(backend or BaseBackend(),
                                _placeholders(program, arguments, compiling),
                                compiling=compiling)
    if caller is not None:
        caller.child_states.append(tracer)
    with TracingScope(tracer):
        tracer.ret_value = program.func(tracer, **tracer.arguments)
    return tracer


def extract_prefix_by_tracing(program: SglFunction, backend: BaseBackend) -> str:
    """The constant text every run of ``program`` starts with."""
    tracer = TracerProgramState(backend, _placeholders(program, {}), only_trace_prefix=True)
    try:
        with TracingScope(tracer):
            program.func(tracer, **tracer.arguments)
    except (StopTracing, TypeError, AttributeError, KeyError, ValueError):
        pass
    prefix = []
    for node in tracer.flatten_nodes():
        if not isinstance(node, SglConstantText):
            break
        prefix.append(node.value)
    return "".join(prefix)


class TracerProgramState(RoleMixin):
    """A stand-in for ProgramState that records expressions instead of running them."""

    def __init__(self, backend: BaseBackend, arguments: dict[str, Any],
                 only_trace_prefix: bool = False, compiling: bool = False) -> None:
        self.pid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.only_trace_prefix = only_trace_prefix
        self.compiling = compiling
        self.chat_template = backend.get_chat_template()
        self.nodes: list[SglExpr] = []
        self.last_node: SglExpr | None = None
        self.variables: dict[str, SglVariable] = {}
        self.messages_: list[dict[str, str]] = []
        self.cur_role: str | None = None
        self.child_states: list[TracerProgramState] = []
        self.ret_value: Any = None

    # -- the program-facing API ----------------------------------------------------------------

    def __iadd__(self, other: Any) -> Self:
        self._submit(other)
        return self

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def get_var(self, name: str) -> Any:
        if name in self.variables:
            v = self.variables[name]
            if isinstance(v, list):  # gathered by a join: one variable per branch
                return [self._read(x) for x in v]
            return self._read(v)
        if name in self.arguments:
            return self.arguments[name]
        raise KeyError(name)

    def _read(self, v: SglVariable) -> SglVariable:
        return (CompileVariable if self.compiling else SglVariable)(v.name, v.source, v.origin)

    def _produced(self, name: str) -> None:
        """Register variable ``name`` as produced by the node just appended."""
        self.variables[name] = SglVariable(name, self.last_node, (self, len(self.nodes) - 1))

    def fork(self, size: int = 1) -> ProgramStateGroup:
        if self.only_trace_prefix:
            raise StopTracing()
        fork_node = SglFork(int(size))
        self._append(fork_node)
        states = [self._branch(fork_node, i) for i in range(int(size))]
        self.child_states.extend(states)
        return ProgramStateGroup(states, self)

    @contextmanager
    def copy(self) -> Iterator[TracerProgramState]:
        """``with s.copy() as c: ...``: one branch, joined when the block ends."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def _branch(self, fork_node: SglFork, index: int) -> TracerProgramState:
        state = TracerProgramState(self.backend, self.arguments, self.only_trace_prefix,
                                   self.compiling)
        node = SglGetForkItem(index)
        node.prev_node = fork_node
        state.nodes = [node]
        state.last_node = node
        state.variables = dict(self.variables)
        state.messages_ = list(self.messages_)
        state.cur_role = self.cur_role
        return state

    def sync(self) -> None:
        """Nothing runs while tracing."""

    def _join_branches(self, branches: list[TracerProgramState], mode: str) -> None:
        self._append(SglJoin(branches, mode))
        if mode != "gather_variable":
            return
        known = set(self.variables)
        for branch in branches:
            for name in branch.variables.keys() - known:
                self.variables.setdefault(name, []).append(branch.variables[name])

    def print_graph(self) -> str:
        """Print and return the traced graph (this state and its forked branches)."""
        heads = [self.last_node] + [c.last_node for c in self.child_states]
        text = "".join(h.print_graph_dfs() for h in heads if h is not None)
        print(text, end="")
        return text

    def flatten_nodes(self) -> list[SglExpr]:
        out: list[SglExpr] = []

        def walk(node: SglExpr) -> None:
            if isinstance(node, SglExprList):
                for child in node.expr_list:
                    walk(child)
            else:
                out.append(node)

        for node in self.nodes:
            walk(node)
        return out

    # -- recording -----------------------------------------------------------------------------

    def _submit(self, expr: Any) -> None:
        expr = as_expr(expr)
        if isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._submit(e)
        elif isinstance(expr, (SglGen, SglSelect)):
            name = expr.name if expr.name is not None else f"var_{len(self.variables)}"
            self._append(expr)
            self._produced(name)
        elif isinstance(expr, (SglRoleBegin, SglRoleEnd)) and self.compiling:
            self._append(expr)  # rendered when run, with the running backend's template
        elif isinstance(expr, SglRoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, SglRoleEnd):
            self._role_end(expr.role)
        elif isinstance(expr, (SglConstantText, SglVarScopeBegin)):
            self._append(expr)
        elif isinstance(expr, SglVarScopeEnd):
            self._append(expr)
            self._produced(expr.name)
        elif isinstance(expr, SglSeparateReasoning) and not self.only_trace_prefix:
            self._append(expr)
            for name in (expr.var, expr.name):
                self._produced(name)
        elif self.only_trace_prefix:
            raise StopTracing()
        else:
            self._append(expr)

    def _append(self, expr: SglExpr) -> None:
        if self.only_trace_prefix and not isinstance(expr, SglConstantText):
            raise StopTracing()
        self.nodes.append(expr)
        expr.prev_node = self.last_node
        self.last_node = expr

    def _role_begin(self, role: str) -> None:
        default_system = self.chat_template.default_system_prompt
        if not self.messages_ and role != "system" and default_system:
            self._role_begin("system")
            self._append(SglConstantText(default_system))
            self._role_end("system")
        prefix, _ = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._append(SglConstantText(prefix))
        self.cur_role = role

    def _role_end(self, role: str) -> None:
        _, suffix = self.chat_template.get_prefix_and_suffix(role, self.messages_)
        self._append(SglConstantText(suffix))
        self.messages_.append({"role": role, "content": ""})
        self.cur_role = None
