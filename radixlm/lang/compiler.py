"""Compiled programs: SGLang's ``SglFunction.compile()``.

``compile()`` runs the program's Python code once, on placeholder arguments, and keeps the
expression graph it built: one stream per program state (the program's own, each fork branch,
each program its code called), linked by the variables one stream reads from another, by forks
and by joins. ``run`` and ``run_batch`` execute that graph without running the Python code
again: the streams' expressions are queued on their executors in a topological order, so
independent streams generate concurrently, and a read of a variable waits for the expression
that produces it.

A compiled program gives the states ``run`` gives for programs whose Python code only builds
expressions. Code that decides something from an argument's value or from generated text
(``if s["x"] == ...``, an f-string of an argument, a loop over one) or reads a state's text
cannot be compiled: ``compile()`` raises CompileError rather than keep one arbitrary path.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.lang.comp_graph import (
    CompGraphNode,
    CompileError,
    collect_streams,
    topological_order,
)
from radixlm.lang.function import _backend, split_sampling_kwargs
from radixlm.lang.global_config import global_config
from radixlm.lang.graph_executor import GraphExecutor, Slot
from radixlm.lang.ir import (
    SglArgument,
    SglExpr,
    SglFork,
    SglGen,
    SglGetForkItem,
    SglJoin,
    SglSamplingParams,
    SglSelect,
    SglSeparateReasoning,
    SglVariable,
    SglVarScopeEnd,
    as_expr,
)
from radixlm.lang.runner import cache_program, run_concurrently
from radixlm.lang.state import ProgramState, ProgramStateGroup
from radixlm.lang.tracer import TracerProgramState, trace_program

if TYPE_CHECKING:
    from radixlm.lang.backend.base import BaseBackend
    from radixlm.lang.function import SglFunction

# The exceptions that Python code raises when it treats a placeholder as a value.
_TRACE_ERRORS = (TypeError, AttributeError, KeyError, IndexError)
_PRODUCERS = (SglGen, SglSelect, SglVarScopeEnd, SglSeparateReasoning)


def compile_func(function: SglFunction, backend: Any = None) -> CompiledFunction:
    """Trace ``function`` once (on ``backend``, else the default one) and compile the graph."""
    resolved = _backend(backend, required=False)
    try:
        tracer = trace_program(function, {}, resolved, compiling=True)
    except _TRACE_ERRORS as e:
        raise CompileError(
            f"cannot compile {function.__name__}: {type(e).__name__}: {e}. compile() runs the "
            "program's code once, on placeholders for its arguments and generated text, so the "
            "code may append them but not inspect them (run() such a program, or bind() the "
            "arguments its code inspects)"
        ) from e
    return CompiledFunction(tracer, function, resolved)


class CompiledFunction:
    """A traced program: ``run(**kwargs)``, ``run_batch([...])`` and ``print_graph()``.

    Runs take the same arguments as ``SglFunction.run`` / ``run_batch`` (sampling defaults such
    as ``temperature`` or ``max_new_tokens`` by keyword) and return the same ProgramStates.
    They run on their ``backend``, else the default backend, else the one given to
    ``compile``."""

    def __init__(self, tracer: TracerProgramState, function: SglFunction,
                 backend: BaseBackend | None = None) -> None:
        self.function = function
        self.backend = backend
        self._arg_defaults = _argument_defaults(function)
        self._placeholders = {id(v): name for name, v in tracer.arguments.items()
                              if isinstance(v, SglArgument)}
        self._streams = collect_streams(tracer)
        self._stream_index = {id(state): i for i, state in enumerate(self._streams)}
        self._stream_nodes = [
            [CompGraphNode(expr, i, k) for k, expr in enumerate(state.nodes)]
            for i, state in enumerate(self._streams)
        ]
        self._by_expr: dict[int, list[CompGraphNode]] = {}
        for nodes in self._stream_nodes:
            for prev, node in zip([None, *nodes], nodes):
                node.prev_node = prev
                self._by_expr.setdefault(id(node.expr), []).append(node)
        main = self._stream_nodes[0]
        self.last_node = main[-1] if main else None
        # Per node: what a run needs besides the expression itself.
        self._reads: dict[int, tuple[CompGraphNode, Any]] = {}
        self._captures: dict[int, list[Any]] = {}
        self._params: dict[int, dict[str, str]] = {}
        self._branches: dict[int, list[int]] = {}
        self._joined: dict[int, list[int]] = {}
        self._text_arguments: set[str] = set()
        for nodes in self._stream_nodes:
            for node in nodes:
                self._link(node)
        self.nodes = topological_order(self._stream_nodes)
        self._ret_value = tracer.ret_value
        self._return_reads: dict[int, tuple[CompGraphNode, Any]] = {}
        self._check_return(self._ret_value)

    # -- building the graph --------------------------------------------------------------------

    def _fail(self, reason: str) -> CompileError:
        return CompileError(f"cannot compile {self.function.__name__}: {reason}")

    def _node_of(self, expr: SglExpr, what: str) -> CompGraphNode:
        nodes = self._by_expr.get(id(expr), [])
        if not nodes:
            raise self._fail(f"{what} comes from a state that is not part of this program")
        if len(nodes) > 1:
            raise self._fail(f"{what} comes from {expr!r}, which the program appends "
                             f"{len(nodes)} times; append a new expression each time")
        return nodes[0]

    def _source_of(self, var: SglVariable) -> tuple[CompGraphNode, Any]:
        """The node producing ``var`` and the executor variable holding its value; the value is
        captured right after that node runs."""
        what = f"variable {var.name!r}"
        if not isinstance(var.source, _PRODUCERS):
            raise self._fail(f"{what} has no producing expression")
        if var.origin is not None:
            state, index = var.origin
            stream = self._stream_index.get(id(state))
            if stream is None:
                raise self._fail(f"{what} comes from a state that is not part of this program")
            producer = self._stream_nodes[stream][index]
        else:
            producer = self._node_of(var.source, what)
        key = var.name if isinstance(var.source, SglSeparateReasoning) else var.source.name
        keys = self._captures.setdefault(id(producer), [])
        if key not in keys:
            keys.append(key)
        return producer, key

    def _argument_name(self, arg: SglArgument) -> str:
        name = self._placeholders.get(id(arg))
        if name is None:
            raise self._fail(f"argument {arg.name!r} of a program it calls is not given")
        return name

    def _link(self, node: CompGraphNode) -> None:
        expr = node.expr
        if isinstance(expr, SglGetForkItem):
            fork = self._node_of(expr.prev_node, "a fork branch")
            node.source_nodes.append(fork)
            branches = self._branches.setdefault(id(fork), [])
            branches.append(node.stream)
            branches.sort(key=lambda i: self._stream_nodes[i][0].expr.index)
        elif isinstance(expr, SglVariable):
            producer, key = self._source_of(expr)
            node.source_nodes.append(producer)
            self._reads[id(node)] = (producer, key)
        elif isinstance(expr, SglJoin):
            self._link_join(node, expr)
        elif isinstance(expr, SglArgument):
            self._text_arguments.add(self._argument_name(expr))
        elif isinstance(expr, (SglGen, SglSelect)):
            self._link_generation(node, expr)

    def _link_join(self, node: CompGraphNode, expr: SglJoin) -> None:
        streams = []
        for branch, size in zip(expr.branches, expr.sizes):
            if len(branch.nodes) != size:
                raise self._fail("it appends to a fork branch after joining it")
            streams.append(self._stream_index[id(branch)])
            node.source_nodes.append(self._stream_nodes[streams[-1]][-1])
        self._joined[id(node)] = streams

    def _link_generation(self, node: CompGraphNode, expr: SglGen | SglSelect) -> None:
        if expr.name is not None and not isinstance(expr.name, str):
            raise self._fail(f"the name of {expr!r} must be a str, not {expr.name!r}")
        if isinstance(expr, SglGen):
            params_ = expr.sampling_params  # (not asdict: it would copy the placeholders)
            fields = {f.name: getattr(params_, f.name) for f in dataclasses.fields(params_)}
        else:
            if not all(isinstance(c, str) for c in expr.choices):
                raise self._fail(f"the choices of {expr!r} must be strs known when tracing")
            fields = {"temperature": expr.temperature, "choices_method": expr.choices_method}
        params = {}
        for field, value in fields.items():
            if isinstance(value, SglArgument):
                params[field] = self._argument_name(value)
            elif isinstance(value, SglExpr) or _holds_expr(value):
                raise self._fail(f"{field}= of {expr!r} depends on generated text")
        if params:
            self._params[id(node)] = params

    def _check_return(self, value: Any) -> None:
        if isinstance(value, (TracerProgramState, ProgramStateGroup)):
            raise self._fail("it returns a program state; a compiled program returns values")
        if isinstance(value, SglVariable):
            self._return_reads[id(value)] = self._source_of(value)
        elif isinstance(value, SglArgument):
            self._argument_name(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self._check_return(item)
        elif isinstance(value, dict):
            for item in value.values():
                self._check_return(item)

    # -- the public API ------------------------------------------------------------------------

    def print_graph(self) -> str:
        """Print and return the graph, one node a line in execution order."""
        text = "".join(f"{node!r}\n" for node in self.nodes)
        print(text, end="")
        return text

    def run(self, *args: Any, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once and return the ProgramState, as ``SglFunction.run`` does: keyword arguments
        named like sampling parameters are the defaults of every ``gen``; the rest are the
        program's arguments. A wrong argument raises TypeError."""
        defaults, program_args = split_sampling_kwargs(kwargs, self.function.arg_names)
        return self._run_once(self._backend(backend), args, program_args, defaults, True)

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[tuple],
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **sampling: Any,
    ) -> list[ProgramState] | Iterator[ProgramState]:
        """Run once per argument dict, concurrently; the states in order (yielded in order with
        ``generator_style``). The program's constant prefix is cached first. A failing run does
        not stop the batch: its state reports ``error()``."""
        defaults, extra = split_sampling_kwargs(sampling)
        if extra:
            raise TypeError(f"run_batch got unknown keyword argument(s) {sorted(extra)}")
        batch = self.function._as_dicts(batch_kwargs)
        chosen = self._backend(backend)
        if global_config.enable_precache_with_tracing and len(batch) > 1:
            cache_program(self.function, chosen)
        return run_concurrently(
            lambda kwargs: self._run_once(chosen, (), kwargs, defaults, False),
            batch, num_threads, progress_bar, generator_style,
        )

    def __repr__(self) -> str:
        return f"CompiledFunction({self.function.__name__}, {len(self.nodes)} nodes)"

    # -- running -------------------------------------------------------------------------------

    def _backend(self, backend: Any) -> BaseBackend:
        if backend is None and global_config.default_backend is None:
            backend = self.backend
        return _backend(backend)

    def _run_once(self, backend: BaseBackend, args: tuple, kwargs: dict[str, Any],
                  defaults: SglSamplingParams, reraise: bool) -> ProgramState:
        main = GraphExecutor(backend, {}, defaults)
        state = ProgramState(main)
        try:
            arguments = self._bind(args, kwargs)
            main.arguments = arguments
            slots = self._execute(main, arguments)
            state.ret_value = self._resolve(self._ret_value, arguments, slots)
        except Exception as e:
            main.sync()
            main.fail(e)
            if reraise:
                raise
        finally:
            main.end()
        return state

    def _bind(self, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The program's arguments, checked as a call of its Python function would check them."""
        names, name = self.function.arg_names, self.function.__name__
        if len(args) > len(names):
            raise TypeError(f"{name}() takes {len(names)} argument(s) but {len(args)} were given")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key in values:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            values[key] = value
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(f"{name}() got unexpected keyword argument(s) {unknown}")
        values.update(self.function.bind_arguments)
        for key in names:
            if key not in values:
                if key not in self._arg_defaults:
                    raise TypeError(f"{name}() missing required argument {key!r}")
                values[key] = self._arg_defaults[key]
        for key in self._text_arguments:
            if not isinstance(values[key], (str, SglExpr)):
                kind = type(values[key]).__name__
                raise TypeError(f"argument {key!r} is appended to the program's text, so it "
                                f"must be a str, not {kind}")
        return values

    def _execute(self, main: GraphExecutor,
                 arguments: dict[str, Any]) -> dict[tuple[int, Any], Slot]:
        """Queue every node on its stream's executor, wait for all of them, and return the
        captured variable values."""
        exes: dict[int, GraphExecutor] = {0: main}
        for i, nodes in enumerate(self._stream_nodes[1:], start=1):
            if not nodes or not isinstance(nodes[0].expr, SglGetForkItem):
                exes[i] = GraphExecutor(main.backend, {}, main.default_sampling_para)
        slots: dict[tuple[int, Any], Slot] = {}
        try:
            for node in self.nodes:
                self._submit(node, exes, slots, arguments)
        finally:
            for exe in exes.values():
                exe.sync()
            for i, exe in exes.items():
                if i != 0 and not exe.ended:
                    exe.end()
        return slots

    def _submit(self, node: CompGraphNode, exes: dict[int, GraphExecutor],
                slots: dict[tuple[int, Any], Slot], arguments: dict[str, Any]) -> None:
        expr, exe = node.expr, exes[node.stream]
        if isinstance(expr, SglGetForkItem):
            return
        if isinstance(expr, SglFork):
            # NOTE: fork and join wait for the streams they copy or gather, here on the calling
            # thread; everything they wait for was queued before them (topological order).
            for stream, branch in zip(self._branches.get(id(node), []), exe.fork(expr.number)):
                exes[stream] = branch
            return
        if isinstance(expr, SglJoin):
            branches = [ProgramState(exes[i]) for i in self._joined[id(node)]]
            ProgramState(exe)._join_branches(branches, expr.mode)
            return
        if isinstance(expr, SglArgument):
            expr = as_expr(arguments[self._placeholders[id(expr)]])
        elif id(node) in self._reads:
            producer, key = self._reads[id(node)]
            expr = SglVariable(expr.name, slots[(id(producer), key)])
        elif id(node) in self._params:
            expr = _with_arguments(expr, self._params[id(node)], arguments)
        exe.submit(expr)
        for key in self._captures.get(id(node), ()):
            slots[(id(node), key)] = Slot(key)
            exe.capture(slots[(id(node), key)], key)

    def _resolve(self, value: Any, arguments: dict[str, Any],
                 slots: dict[tuple[int, Any], Slot]) -> Any:
        """The traced return value with its variables and arguments replaced by their values."""
        if isinstance(value, SglVariable):
            producer, key = self._return_reads[id(value)]
            return slots[(id(producer), key)].get_var(value.name)
        if isinstance(value, SglArgument):
            return arguments[self._placeholders[id(value)]]
        if isinstance(value, (list, tuple)):
            items = [self._resolve(item, arguments, slots) for item in value]
            return items if isinstance(value, list) else type(value)(items)
        if isinstance(value, dict):
            return {k: self._resolve(v, arguments, slots) for k, v in value.items()}
        return value


def _argument_defaults(function: SglFunction) -> dict[str, Any]:
    params = list(inspect.signature(function.func).parameters.values())[1:]
    return {p.name: p.default for p in params if p.default is not p.empty}


def _holds_expr(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, SglExpr) or _holds_expr(v) for v in value)
    if isinstance(value, dict):
        return any(isinstance(v, SglExpr) or _holds_expr(v) for v in value.values())
    return False


def _with_arguments(expr: SglGen | SglSelect, params: dict[str, str],
                    arguments: dict[str, Any]) -> SglGen | SglSelect:
    """A copy of ``expr`` whose parameters that were arguments hold the arguments' values."""
    values = {field: arguments[name] for field, name in params.items()}
    if isinstance(expr, SglGen):
        return SglGen(expr.name, dataclasses.replace(expr.sampling_params, **values))
    return SglSelect(expr.name, expr.choices, values.get("temperature", expr.temperature),
                     values.get("choices_method", expr.choices_method))
