"""SglFunction: what ``@function`` makes of a program."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from radixlm.lang.ir import SglSamplingParams

RUN_SAMPLING_KEYS = frozenset({
    "max_new_tokens", "min_new_tokens", "stop", "stop_token_ids", "temperature", "top_p",
    "top_k", "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
})


def split_sampling_kwargs(
    kwargs: dict[str, Any], arg_names: list[str] = ()
) -> tuple[SglSamplingParams, dict[str, Any]]:
    """Separate default sampling parameters (``temperature=0``, ``max_new_tokens=16``, ...)
    from program arguments; a program argument of the same name wins."""
    sampling, program_args = {}, {}
    for key, value in kwargs.items():
        if key in RUN_SAMPLING_KEYS and key not in arg_names:
            sampling[key] = value
        else:
            program_args[key] = value
    return SglSamplingParams(**sampling), program_args


class SglFunction:
    """A program: ``prog.run(...)``, ``prog.run_batch([...])``, ``prog.trace()``, ``prog.bind()``.

    The wrapped function takes the program state as its first parameter (conventionally ``s``).
    """

    def __init__(self, func: Callable, num_api_spec_tokens: int | None = None,
                 bind_arguments: dict[str, Any] | None = None) -> None:
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                                params[0].POSITIONAL_OR_KEYWORD):
            raise TypeError(f"{func.__name__} must take the program state as its first argument")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = [p.name for p in params[1:]]
        self.arg_defaults = [p.default for p in params[1:] if p.default is not p.empty]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def __repr__(self) -> str:
        return f"SglFunction({self.__name__})"

    def bind(self, **kwargs: Any) -> SglFunction:
        """A copy with some arguments fixed."""
        unknown = sorted(set(kwargs) - set(self.arg_names))
        if unknown:
            raise TypeError(f"{self.__name__} has no argument(s) {unknown}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any):
        """Run once and return the ProgramState. Keyword arguments named like sampling
        parameters (``temperature``, ``max_new_tokens``, ``stop``, ...) are the defaults of every
        ``gen``; the rest are the program's arguments. An exception raised by the program's
        code propagates (and is also kept in ``state.error()``)."""
        from radixlm.lang.runner import run_program

        defaults, program_args = split_sampling_kwargs(kwargs, self.arg_names)
        return run_program(self, _backend(backend), args, program_args, defaults, stream)

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]] | list[tuple],
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        generator_style: bool = False,
        **sampling: Any,
    ):
        """Run once per argument dict, concurrently; return the states in order (or yield them
        in order with ``generator_style``). The constant prefix of the program is cached once
        first. A failing program does not stop the batch: its state reports ``error()``."""
        from radixlm.lang.runner import run_program_batch

        defaults, extra = split_sampling_kwargs(sampling)
        if extra:
            raise TypeError(f"run_batch got unknown keyword argument(s) {sorted(extra)}")
        return run_program_batch(self, _backend(backend), self._as_dicts(batch_kwargs), defaults,
                                 num_threads, progress_bar, generator_style)

    def _as_dicts(self, batch: list[Any]) -> list[dict[str, Any]]:
        if not isinstance(batch, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts")
        out = []
        for item in batch:
            if isinstance(item, dict):
                out.append(dict(item))
            elif isinstance(item, (list, tuple)) and len(item) <= len(self.arg_names):
                out.append(dict(zip(self.arg_names, item)))
            else:
                raise TypeError(f"{item!r} does not match the arguments {self.arg_names}")
        return out

    def trace(self, *, backend: Any = None, **kwargs: Any):
        """Build the expression graph; arguments not given are placeholders.
        ``prog.trace().print_graph()`` shows it."""
        from radixlm.lang.tracer import trace_program

        resolved = _backend(backend, required=False)
        return trace_program(self, kwargs, resolved)

    def compile(self, *, backend: Any = None):
        """Trace the program once into a CompiledFunction (SGLang's ``compile``) whose ``run`` /
        ``run_batch`` execute the traced graph without running the Python code again; programs
        it calls and fork branches run concurrently. ``backend`` (else the default one) is the
        one the trace sees and the one runs fall back to. Raises CompileError when the code
        depends on argument values or generated text."""
        from radixlm.lang.compiler import compile_func

        return compile_func(self, backend)

    def cache(self, backend: Any = None) -> str:
        """Cache the program's constant prefix in the backend; return the prefix."""
        from radixlm.lang.runner import cache_program

        return cache_program(self, _backend(backend), min_chars=0)

    def __call__(self, *args: Any, **kwargs: Any):
        from radixlm.lang.tracer import current_tracer

        tracer = current_tracer()
        if tracer is None:
            return self.run(*args, **kwargs)
        return self.trace(backend=tracer.backend, **dict(zip(self.arg_names, args)), **kwargs)


def _backend(backend: Any, required: bool = True):
    from radixlm.lang.backend.base import resolve_backend
    from radixlm.lang.global_config import global_config

    chosen = backend if backend is not None else global_config.default_backend
    if chosen is None and not required:
        return None
    return resolve_backend(chosen)
