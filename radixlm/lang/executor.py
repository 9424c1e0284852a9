"""StreamExecutor: executes one program state's expressions in order, off the caller's thread.

The program's Python code only queues expressions; a short-lived worker thread drains the
queue, so a program runs ahead until it reads a variable, and forked branches run concurrently
(their requests batch together in the runtime).
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

from radixlm.lang.ir import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    SglArgument,
    SglCommitLazy,
    SglConcateAndAppend,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglGen,
    SglMedia,
    SglRoleBegin,
    SglRoleEnd,
    SglSamplingParams,
    SglSelect,
    SglSeparateReasoning,
    SglVariable,
    SglVarScopeBegin,
    SglVarScopeEnd,
    as_expr,
)
from radixlm.lang.media import image_url
from radixlm.lang.tools import read_tool_calls
from radixlm.runtime.reasoning import REASONING_PARSERS, get_reasoning_parser

if TYPE_CHECKING:
    from radixlm.lang.backend.base import BaseBackend
    from radixlm.lang.chat_template import ChatTemplate


class ProgramError(RuntimeError):
    """A variable was read from a program whose execution failed; ``__cause__`` is the error."""


_DTYPES = {
    "int": (REGEX_INT, [" ", "\n"], int),
    "float": (REGEX_FLOAT, [" ", "\n"], float),
    "str": (REGEX_STR, [], str),
    "bool": (REGEX_BOOL, [], lambda text: text == "True"),
}


def _dtype_name(dtype: Any) -> str:
    name = dtype.__name__ if isinstance(dtype, type) else str(dtype)
    name = {"string": "str"}.get(name, name)
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; use int, float, str or bool")
    return name


class StreamExecutor:
    """The text, messages and variables of one program state, and the queue that builds them."""

    def __init__(
        self,
        backend: BaseBackend,
        arguments: dict[str, Any],
        default_sampling_para: SglSamplingParams,
        chat_template: ChatTemplate | None = None,
        stream: bool = False,
        num_api_spec_tokens: int | None = None,
    ) -> None:
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_sampling_para = default_sampling_para
        self.chat_template = chat_template or backend.get_chat_template()
        self.stream = stream
        # SGLang's API speculative execution (completion models): one request of at least this
        # many tokens, without stops, whose text later gens with a stop take in turn while the
        # program's own text between them matches it
        self.num_api_spec_tokens = num_api_spec_tokens
        self.speculated_text = ""
        self.text_ = ""
        self.messages_: list[dict[str, Any]] = []
        self.cur_images: list[tuple[int, str]] = []  # (where in text_, URL) in the open role
        self.variables: dict[Any, Any] = {}
        self.meta_info: dict[Any, Any] = {}
        self.variable_event: dict[Any, threading.Event] = {}
        self.stream_var_event: dict[Any, threading.Event] = {}
        self.stream_text_event = threading.Event()
        self.cur_role: str | None = None
        self.cur_role_begin_pos = 0
        self.fork_start_text_pos: int | None = None
        self.error_: BaseException | None = None
        self.is_finished = False
        self._scope_starts: dict[str, int] = {}
        self._pending: deque[SglExpr] = deque()
        self._running = False
        self._ended = False
        self._cond = threading.Condition()

    # -- the queue -----------------------------------------------------------------------------

    def submit(self, expr: SglExpr | str) -> None:
        """Queue ``expr``; it runs after everything queued before it."""
        expr = as_expr(expr)
        self._init_var_event(expr)
        with self._cond:
            if self.error_ is not None:
                self._release_events()
                return
            self._pending.append(expr)
            if not self._running:
                self._running = True
                threading.Thread(target=self._drain, name="radixlm-lang", daemon=True).start()

    def _drain(self) -> None:
        while True:
            with self._cond:
                if not self._pending or self.error_ is not None:
                    self._pending.clear()
                    self._running = False
                    self.is_finished = self._ended
                    self._cond.notify_all()
                    break
                expr = self._pending.popleft()
            try:
                self._execute(expr)
            except Exception as e:  # noqa: BLE001  (reported by error() and on variable reads)
                self.fail(e)
            self.stream_text_event.set()
        self.stream_text_event.set()

    def sync(self) -> None:
        """Wait until everything queued so far has run."""
        with self._cond:
            self._cond.wait_for(lambda: not self._running)

    def end(self) -> None:
        """Mark the program's code as returned; ``is_finished`` once the queue drains too."""
        with self._cond:
            self._ended = True
            self.is_finished = not self._running
        self.stream_text_event.set()
        self.backend.end_program(self)

    def fail(self, error: BaseException) -> None:
        """Record ``error`` (the first one wins), drop queued work and wake every reader."""
        with self._cond:
            if self.error_ is None:
                self.error_ = error
        self._release_events()

    def _release_events(self) -> None:
        for event in list(self.variable_event.values()) + list(self.stream_var_event.values()):
            event.set()
        self.stream_text_event.set()

    def _init_var_event(self, expr: SglExpr) -> None:
        if isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)):
            self.variable_event[expr.name] = threading.Event()
            self.stream_var_event[expr.name] = threading.Event()
        elif isinstance(expr, SglSeparateReasoning):
            name = expr.name
            self.variable_event[name] = threading.Event()
            self.stream_var_event[name] = threading.Event()
        elif isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._init_var_event(e)

    # -- reading -------------------------------------------------------------------------------

    def get_var(self, name: Any) -> Any:
        """The value of ``name``, waiting until it is produced."""
        event = self.variable_event.get(name)
        if event is not None:
            event.wait()
        if name in self.variables:
            return self.variables[name]
        if self.error_ is not None:
            raise ProgramError(
                f"variable {name!r} is unavailable: the program failed with {self.error_!r}"
            ) from self.error_
        raise KeyError(name)

    def set_var(self, name: Any, value: Any) -> None:
        self.variables[name] = value

    def get_meta_info(self, name: Any, timeout: float | None = None) -> Any:
        event = self.variable_event.get(name)
        if event is not None and not event.wait(timeout):
            raise TimeoutError(f"timed out waiting for variable {name!r}")
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.text_

    def messages(self) -> list[dict[str, Any]]:
        self.sync()
        return self.messages_

    def error(self) -> BaseException | None:
        self.sync()
        return self.error_

    # -- fork ----------------------------------------------------------------------------------

    def fork(self, size: int = 1) -> list[StreamExecutor]:
        """``size`` executors that continue from this one's text; with ``size > 1`` the shared
        text is cached in the backend first, so the branches reuse its KV."""
        self.sync()
        if size > 1 and self.text_ and self.error_ is None:
            try:
                self.backend.commit_lazy_operations(self)
            except Exception as e:  # noqa: BLE001
                self.fail(e)
        return [self._branch() for _ in range(int(size))]

    def _branch(self) -> StreamExecutor:
        # NOTE: type(self): a compiled program's executor forks into executors of its own kind
        exe = type(self)(self.backend, self.arguments, self.default_sampling_para,
                         self.chat_template, self.stream)
        exe.variables = dict(self.variables)
        exe.meta_info = dict(self.meta_info)
        exe.text_ = self.text_
        exe.messages_ = list(self.messages_)
        exe.cur_images = list(self.cur_images)
        exe.cur_role = self.cur_role
        exe.cur_role_begin_pos = self.cur_role_begin_pos
        exe.fork_start_text_pos = len(self.text_)
        exe.error_ = self.error_
        return exe

    # -- execution -----------------------------------------------------------------------------

    def _execute(self, expr: SglExpr) -> None:
        handler = _HANDLERS.get(type(expr))
        if handler is None:
            raise TypeError(f"cannot execute {expr!r}")
        handler(self, expr)

    def _execute_list(self, expr: SglExprList) -> None:
        for e in expr.expr_list:
            self._execute(e)

    def _fill(self, value: Any) -> None:
        value = str(value)
        if self.speculated_text.startswith(value):
            self.speculated_text = self.speculated_text[len(value):]
        else:
            self.speculated_text = ""
        self.text_ += value

    def _execute_constant(self, expr: SglConstantText) -> None:
        self._fill(expr.value)

    def _execute_argument(self, expr: SglArgument) -> None:
        self._fill(expr.value)

    def _execute_variable(self, expr: SglVariable) -> None:
        self._fill(expr.source.get_var(expr.name))

    def _execute_gen(self, expr: SglGen) -> None:
        params = self._resolve_sampling_params(expr.sampling_params)
        if self.stream and (params.n or 1) == 1:
            self._execute_gen_stream(expr.name, params)
            return
        if self._speculates(params):
            comp, meta = self._spec_gen(params)
        else:
            self.speculated_text = ""
            comp, meta = self.backend.generate(self, params)
        self.text_ += comp[0] if isinstance(comp, list) else comp
        if params.parse_tool_calls and isinstance(comp, str):
            meta = {**(meta or {}), "tool_calls": read_tool_calls(comp)[1]}
        self._set_var(expr.name, self._typed(comp, params.dtype), meta)

    def _speculates(self, params: SglSamplingParams) -> bool:
        """API speculation covers plain text gens that end at a stop, on completion models."""
        if self.num_api_spec_tokens is None or self.backend.is_chat_model:
            return False
        plain = ((params.n or 1) == 1 and params.regex is None and params.json_schema is None
                 and params.stop_regex is None and not params.parse_tool_calls)  # fmt: skip
        return plain and bool(params.stop_list())

    def _spec_gen(self, params: SglSamplingParams) -> tuple[str, dict]:
        """This gen's text from the speculated text (one request without stops makes it when
        there is none): up to its first stop string, which stays for the text that follows;
        with no stop in it, as SGLang, at most ``max_new_tokens`` characters."""
        meta: dict = {}
        if not self.speculated_text:
            wide = params.merged(SglSamplingParams(
                max_new_tokens=max(params.max_new_tokens or 0, self.num_api_spec_tokens)))
            wide.stop = []
            self.speculated_text, meta = self.backend.generate(self, wide)
        found = [i for i in (self.speculated_text.find(s) for s in params.stop_list()) if i >= 0]
        end = min(found) if found else params.max_new_tokens or len(self.speculated_text)
        comp, self.speculated_text = self.speculated_text[:end], self.speculated_text[end:]
        return comp, meta

    def _execute_gen_stream(self, name: Any, params: SglSamplingParams) -> None:
        self.variables[name], meta = "", None
        for delta, meta in self.backend.generate_stream(self, params):
            self.meta_info[name] = meta  # NOTE: before the text: a reader's meta is never behind
            self.text_ += delta
            self.variables[name] += delta
            self.stream_var_event[name].set()
            self.stream_text_event.set()
        if params.parse_tool_calls:
            meta = {**(meta or {}), "tool_calls": read_tool_calls(self.variables[name])[1]}
        self._set_var(name, self._typed(self.variables[name], params.dtype), meta)

    def _execute_select(self, expr: SglSelect) -> None:
        decision = self.backend.select(self, expr.choices, expr.temperature, expr.choices_method)
        self.text_ += decision.decision
        self._set_var(expr.name, decision.decision, decision.meta_info)

    def _set_var(self, name: Any, value: Any, meta: Any) -> None:
        self.variables[name] = value
        self.meta_info[name] = meta
        self.variable_event[name].set()
        self.stream_var_event[name].set()

    def _typed(self, comp: Any, dtype: Any) -> Any:
        if dtype is None:
            return comp
        convert = _DTYPES[_dtype_name(dtype)][2]
        if isinstance(comp, list):
            return [self._typed(c, dtype) for c in comp]
        try:
            return convert(comp.strip())
        except ValueError:
            raise ValueError(f"gen with dtype={dtype!r} produced {comp!r}") from None

    def _resolve_sampling_params(self, overrides: SglSamplingParams) -> SglSamplingParams:
        params = self.default_sampling_para.merged(overrides)
        if params.dtype is not None:
            regex, stop, _ = _DTYPES[_dtype_name(params.dtype)]
            params.regex = regex
            params.stop = params.stop_list() + stop
        if self.chat_template.stop_str:
            params.stop = params.stop_list() + list(self.chat_template.stop_str)
        return params

    def _execute_role_begin(self, expr: SglRoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {expr.role!r} begins inside role {self.cur_role!r}")
        default_system = self.chat_template.default_system_prompt
        if not self.messages_ and expr.role != "system" and default_system:
            self._execute_role_begin(SglRoleBegin("system"))
            self._fill(default_system)
            self._execute_role_end(SglRoleEnd("system"))
        prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._fill(prefix)
        self.cur_role = expr.role
        self.cur_role_begin_pos = len(self.text_)

    def _execute_role_end(self, expr: SglRoleEnd) -> None:
        content = self._role_content()
        _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._fill(suffix)
        self.messages_.append({"role": expr.role, "content": content})
        self.cur_role = None

    def _role_content(self) -> str | list[dict[str, Any]]:
        """The open role's text, or with images OpenAI's content parts in the program's order
        (text, ``image_url``, ...; the image tokens in ``text_`` are left out of the parts)."""
        images, self.cur_images = self.cur_images, []
        if not images:
            return self.text_[self.cur_role_begin_pos:].lstrip()
        parts: list[dict[str, Any]] = []
        start, token = self.cur_role_begin_pos, len(self.chat_template.image_token)
        for at, url in images:
            text = self.text_[start:at]
            if text.strip():
                parts.append({"type": "text", "text": text.lstrip() if not parts else text})
            parts.append({"type": "image_url", "image_url": {"url": url}})
            start = at + token
        if self.text_[start:].strip():
            parts.append({"type": "text", "text": self.text_[start:]})
        return parts

    def _execute_var_scope_begin(self, expr: SglVarScopeBegin) -> None:
        self._scope_starts[expr.name] = len(self.text_)

    def _execute_var_scope_end(self, expr: SglVarScopeEnd) -> None:
        value = self.text_[self._scope_starts.pop(expr.name):]
        self._set_var(expr.name, value, None)

    def _execute_commit_lazy(self, expr: SglCommitLazy) -> None:
        self.backend.commit_lazy_operations(self)

    def _execute_concat_and_append(self, expr: SglConcateAndAppend) -> None:
        for state in expr.states:
            exe = state.stream_executor
            exe.sync()
            self._fill(exe.text_[exe.fork_start_text_pos:])

    def _execute_separate_reasoning(self, expr: SglSeparateReasoning) -> None:
        if expr.model_type not in REASONING_PARSERS:
            known = sorted(REASONING_PARSERS)
            raise ValueError(f"separate_reasoning: unsupported model_type {expr.model_type!r}; "
                             f"known: {known}")  # fmt: skip
        reasoning, content = get_reasoning_parser(expr.model_type).split(self.variables[expr.var])
        self.variables[expr.var] = content
        self._set_var(expr.name, reasoning or "", None)

    def _execute_media(self, expr: SglMedia) -> None:
        if expr.kind != "image" or not self.backend.supports_images:
            raise ValueError(
                f"sgl.{expr.kind}({expr.path!r}): {expr.kind} input is not supported by this "
                f"model ({type(self.backend).__name__}; radixlm serves text-only models, and "
                "images reach a vision chat model through the OpenAI backend)"
            )
        if self.cur_role is None:
            raise ValueError(f"sgl.image({expr.path!r}) must be inside a role (user, ...)")
        self.cur_images.append((len(self.text_), image_url(expr.path)))
        self._fill(self.chat_template.image_token)


_HANDLERS = {
    SglExprList: StreamExecutor._execute_list,
    SglConstantText: StreamExecutor._execute_constant,
    SglArgument: StreamExecutor._execute_argument,
    SglVariable: StreamExecutor._execute_variable,
    SglGen: StreamExecutor._execute_gen,
    SglSelect: StreamExecutor._execute_select,
    SglRoleBegin: StreamExecutor._execute_role_begin,
    SglRoleEnd: StreamExecutor._execute_role_end,
    SglVarScopeBegin: StreamExecutor._execute_var_scope_begin,
    SglVarScopeEnd: StreamExecutor._execute_var_scope_end,
    SglCommitLazy: StreamExecutor._execute_commit_lazy,
    SglConcateAndAppend: StreamExecutor._execute_concat_and_append,
    SglSeparateReasoning: StreamExecutor._execute_separate_reasoning,
    SglMedia: StreamExecutor._execute_media,
}
