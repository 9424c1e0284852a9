"""Running programs: one (``run``), many concurrently (``run_batch``), and prefix caching."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from radixlm.lang.executor import StreamExecutor
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import SglSamplingParams
from radixlm.lang.state import ProgramState

if TYPE_CHECKING:
    from radixlm.lang.backend.base import BaseBackend
    from radixlm.lang.function import SglFunction


def run_program(
    program: SglFunction,
    backend: BaseBackend,
    args: tuple,
    kwargs: dict[str, Any],
    defaults: SglSamplingParams,
    stream: bool,
    reraise: bool = True,
) -> ProgramState:
    """Run ``program`` once. With ``stream`` its code runs on a thread and the state returns
    at once (read it with ``text_iter``); otherwise the state returns when the code has."""
    kwargs = {**kwargs, **program.bind_arguments}
    state = ProgramState(StreamExecutor(
        backend, kwargs, defaults, stream=stream,
        num_api_spec_tokens=getattr(program, "num_api_spec_tokens", None)))
    if stream:
        worker = threading.Thread(
            target=_run_code, args=(state, program, args, kwargs, False), daemon=True
        )
        worker.start()
        return state
    _run_code(state, program, args, kwargs, reraise)
    state.sync()
    return state


def _run_code(state: ProgramState, program: SglFunction, args: tuple, kwargs: dict[str, Any],
              reraise: bool) -> None:
    exe = state.stream_executor
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    except Exception as e:
        exe.sync()
        exe.fail(e)
        if reraise:
            raise
    finally:
        exe.end()


def run_program_batch(
    program: SglFunction,
    backend: BaseBackend,
    batch_kwargs: list[dict[str, Any]],
    defaults: SglSamplingParams,
    num_threads: int | str = "auto",
    progress_bar: bool = False,
    generator_style: bool = False,
) -> list[ProgramState] | Iterator[ProgramState]:
    """Run ``program`` once per argument dict on a thread pool, so that their requests batch
    together in the runtime. The traced constant prefix is cached first."""
    if not batch_kwargs:
        return iter([]) if generator_style else []
    if global_config.enable_precache_with_tracing and len(batch_kwargs) > 1:
        cache_program(program, backend)
    return run_concurrently(
        lambda kwargs: run_program(program, backend, (), kwargs, defaults, False, False),
        batch_kwargs, num_threads, progress_bar, generator_style,
    )


def run_concurrently(
    run_one: Callable[[dict[str, Any]], ProgramState],
    batch_kwargs: list[dict[str, Any]],
    num_threads: int | str = "auto",
    progress_bar: bool = False,
    generator_style: bool = False,
) -> list[ProgramState] | Iterator[ProgramState]:
    """``run_one`` for each argument dict on a thread pool; the states in order (a list, or an
    iterator with ``generator_style``)."""
    if not batch_kwargs:
        return iter([]) if generator_style else []
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    num_threads = max(1, min(int(num_threads), len(batch_kwargs)))
    states = _submit_all(run_one, batch_kwargs, num_threads, progress_bar)
    if generator_style:
        return states
    return list(states)


def _submit_all(run_one, batch_kwargs, num_threads, progress_bar):
    bar = tqdm(total=len(batch_kwargs), disable=not progress_bar)
    pool = ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch")
    futures: list[Future] = []
    for kwargs in batch_kwargs:
        future = pool.submit(run_one, kwargs)
        future.add_done_callback(lambda _: bar.update())
        futures.append(future)
    try:
        for future in futures:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()


def cache_program(program: SglFunction, backend: BaseBackend, min_chars: int | None = None) -> str:
    """Trace ``program``'s constant prefix and prefill it in ``backend``; return the prefix."""
    from radixlm.lang.tracer import extract_prefix_by_tracing

    prefix = extract_prefix_by_tracing(program, backend)
    limit = global_config.precache_min_chars if min_chars is None else min_chars
    if prefix and len(prefix) >= limit:
        backend.cache_prefix(prefix)
    return prefix
