"""radixlm: an LLM inference engine with a radix-tree KV cache and a frontend language."""

from __future__ import annotations

from radixlm.lang import (
    REGEX_BOOL,
    REGEX_FLOAT,
    REGEX_INT,
    REGEX_STR,
    OpenAI,
    ProgramError,
    Runtime,
    RuntimeEndpoint,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    greedy_token_selection,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    token_length_normalized,
    unconditional_likelihood_normalized,
    user,
    user_begin,
    user_end,
)
from radixlm.runtime.engine import Engine

__all__ = [
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Engine", "OpenAI", "ProgramError",
    "Runtime", "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end", "flush_cache",
    "function", "gen", "gen_int", "gen_string", "get_server_info", "greedy_token_selection",
    "select", "set_default_backend", "system", "system_begin", "system_end",
    "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin",
    "user_end",
]
