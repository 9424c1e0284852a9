"""The intermediate representation: the expressions a program appends to its state."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
REGEX_STR = r"\"[\w\d\s]*\""

_RUNTIME_FIELDS = (
    "max_new_tokens", "min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex",
    "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "regex",
    "json_schema",
)
_REQUEST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num",
                   "return_text_in_logprobs")


@dataclass
class SglSamplingParams:
    """Sampling options of a ``gen``; ``None`` means "use the program's or the engine's default"."""

    max_new_tokens: int | None = None
    min_new_tokens: int | None = None
    n: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    ignore_eos: bool | None = None
    return_logprob: bool | None = None
    logprob_start_len: int | None = None
    top_logprobs_num: int | None = None
    return_text_in_logprobs: bool | None = None
    dtype: Any = None
    regex: str | None = None
    json_schema: str | dict | None = None
    # NOTE: set by gen(tools=...); the output is parsed into meta_info["tool_calls"]
    parse_tool_calls: bool | None = None

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}

    def merged(self, overrides: SglSamplingParams) -> SglSamplingParams:
        """A copy where every non-``None`` field of ``overrides`` wins."""
        changes = {k: v for k, v in dataclasses.asdict(overrides).items() if v is not None}
        return dataclasses.replace(self, **changes)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def to_runtime(self) -> dict[str, Any]:
        """The ``sampling_params`` of a ``/generate`` request (only the fields that are set)."""
        out = {k: getattr(self, k) for k in _RUNTIME_FIELDS if getattr(self, k) is not None}
        if "stop" in out:
            out["stop"] = self.stop_list()
            if not out["stop"]:
                del out["stop"]
        return out

    def request_options(self) -> dict[str, Any]:
        """The request-level logprob options of a ``/generate`` request."""
        return {k: getattr(self, k) for k in _REQUEST_FIELDS if getattr(self, k) is not None}


_node_ids = itertools.count()


class SglExpr:
    """Base of every expression; ``a + b`` concatenates expressions (strings become constants)."""

    def __init__(self) -> None:
        self.node_id = next(_node_ids)
        self.prev_node: SglExpr | None = None

    def __add__(self, other: Any) -> SglExprList:
        return _concat(self, as_expr(other))

    def __radd__(self, other: Any) -> SglExprList:
        return _concat(as_expr(other), self)

    def print_graph_dfs(self) -> str:
        """The graph ending at this node, one ``%id = ...`` line per node, dependencies first."""
        lines: list[str] = []
        seen: set[int] = set()
        _graph_lines(self, lines, seen)
        return "".join(lines)


def as_expr(value: Any) -> SglExpr:
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    kind = type(value).__name__
    raise TypeError(f"cannot append a {kind} to a program; use a str or an expression")


def _concat(a: SglExpr, b: SglExpr) -> SglExprList:
    left = a.expr_list if isinstance(a, SglExprList) else [a]
    right = b.expr_list if isinstance(b, SglExprList) else [b]
    return SglExprList(left + right)


def _graph_lines(x: SglExpr | None, lines: list[str], seen: set[int]) -> None:
    if x is None or x.node_id in seen:
        return
    seen.add(x.node_id)
    _graph_lines(x.prev_node, lines, seen)
    if isinstance(x, SglExprList):
        for y in x.expr_list:
            _graph_lines(y, lines, seen)
    elif isinstance(x, SglVariable):
        _graph_lines(x.source, lines, seen)
    if isinstance(x, (SglFork, SglGetForkItem)) or x.prev_node is None:
        lines.append(f"%{x.node_id} = {x!r}\n")
    else:
        lines.append(f"%{x.node_id} = %{x.prev_node.node_id} + {x!r}\n")


class SglExprList(SglExpr):
    def __init__(self, expr_list: list[SglExpr]) -> None:
        super().__init__()
        self.expr_list = expr_list

    def __repr__(self) -> str:
        return f"ExprList({self.expr_list})"


class SglConstantText(SglExpr):
    def __init__(self, value: str) -> None:
        super().__init__()
        self.value = value

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


class SglArgument(SglExpr):
    """A placeholder for a program argument whose value is unknown while tracing."""

    def __init__(self, name: str, value: Any = None) -> None:
        super().__init__()
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"Argument(name={self.name!r})"

    def __format__(self, spec: str) -> str:
        raise TypeError("a traced argument cannot be formatted into an f-string")


class SglGen(SglExpr):
    def __init__(self, name: str | None, sampling_params: SglSamplingParams) -> None:
        super().__init__()
        self.name = name
        self.sampling_params = sampling_params

    def __repr__(self) -> str:
        return f"Gen({self.name!r})"


class SglSelect(SglExpr):
    def __init__(self, name: str | None, choices: list[str], temperature: float,
                 choices_method: Any) -> None:
        super().__init__()
        self.name = name
        self.choices = list(choices)
        self.temperature = temperature
        self.choices_method = choices_method

    def __repr__(self) -> str:
        return f"Select({self.name!r}, choices={self.choices})"


class SglRoleBegin(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"RoleBegin({self.role})"


class SglRoleEnd(SglExpr):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def __repr__(self) -> str:
        return f"RoleEnd({self.role})"


class SglVarScopeBegin(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeBegin({self.name!r})"


class SglVarScopeEnd(SglExpr):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __repr__(self) -> str:
        return f"VarScopeEnd({self.name!r})"


class SglVariable(SglExpr):
    """The value of variable ``name`` produced by ``source`` (an expression or an executor)."""

    def __init__(self, name: str, source: Any, origin: Any = None) -> None:
        super().__init__()
        self.name = name
        self.source = source
        # NOTE: set by tracing: (the traced state, index in its nodes) of ``source``, since one
        # expression object can be appended to several states (``forks += gen("x")``)
        self.origin = origin

    def __repr__(self) -> str:
        src = f"%{self.source.node_id}" if isinstance(self.source, SglExpr) else "state"
        return f"Variable({self.name!r}, source={src})"


class SglFork(SglExpr):
    def __init__(self, number: int) -> None:
        super().__init__()
        self.number = number

    def __repr__(self) -> str:
        prev = f"%{self.prev_node.node_id}" if self.prev_node is not None else "None"
        return f"Fork({prev}, number={self.number})"


class SglGetForkItem(SglExpr):
    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def __repr__(self) -> str:
        prev = f"%{self.prev_node.node_id}" if self.prev_node is not None else "None"
        return f"GetForkItem({prev}, index={self.index})"


class SglJoin(SglExpr):
    """``forks.join(mode)`` as traced: the parent waits for ``branches`` (tracer states) and, by
    ``mode``, gathers their new variables or appends their new text. Only a compiled program
    executes it; a running program joins directly."""

    def __init__(self, branches: list[Any], mode: str) -> None:
        super().__init__()
        self.branches = list(branches)
        self.sizes = [len(b.nodes) for b in self.branches]  # each branch's length when joined
        self.mode = mode

    def __repr__(self) -> str:
        return f"Join({self.mode!r}, branches={len(self.branches)})"


class SglCommitLazy(SglExpr):
    """Cache the text so far in the backend (used before a fork)."""

    def __repr__(self) -> str:
        return "CommitLazy()"


class SglConcateAndAppend(SglExpr):
    """Append the text that each forked state added since the fork."""

    def __init__(self, states: list[Any]) -> None:
        super().__init__()
        self.states = states

    def __repr__(self) -> str:
        return f"ConcatenateAndAppend({len(self.states)} states)"


class SglSeparateReasoning(SglExpr):
    """After the gen or select ``expr`` (or the variable ``var``): that variable becomes the
    content after the reasoning block, and ``name`` (``<var>_reasoning_content``) the
    reasoning. SGLang's shape: ``model_type`` is checked when it runs."""

    def __init__(
        self, model_type: str, expr: SglExpr | None = None, name: str | None = None
    ) -> None:
        super().__init__()
        self.model_type = model_type
        self.expr = expr
        self.var = getattr(expr, "name", None) if expr is not None else name
        if not self.var:
            raise ValueError("Either expr or name must be provided: a named gen or select")
        self.name = self.process_name_for_reasoning(self.var)

    @staticmethod
    def process_name_for_reasoning(name: str) -> str:
        if not name:
            raise ValueError("name must be provided")
        return f"{name}_reasoning_content"

    def __repr__(self) -> str:
        return f"SeparateReasoning(model_type={self.model_type}, name={self.name})"


class SglMedia(SglExpr):
    """``sgl.image`` / ``sgl.video``: an input the text-only models radixlm serves cannot take
    (an image goes to a vision chat model through the ``OpenAI`` backend)."""

    def __init__(self, kind: str, path: str) -> None:
        super().__init__()
        self.kind = kind
        self.path = path

    def __repr__(self) -> str:
        return f"{self.kind.capitalize()}({self.path!r})"
