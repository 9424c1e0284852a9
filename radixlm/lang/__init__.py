"""The frontend language: ``@function`` programs with ``gen``, ``select``, roles and forks.

Follows SGLang's frontend API, so ``import radixlm as sgl`` runs SGLang programs.
"""

from __future__ import annotations

from radixlm.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from radixlm.lang.backend import EngineBackend, OpenAI, Runtime, RuntimeEndpoint
from radixlm.lang.chat_template import ChatTemplate, get_chat_template, register_chat_template
from radixlm.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from radixlm.lang.compiler import CompiledFunction, CompileError
from radixlm.lang.executor import ProgramError
from radixlm.lang.function import SglFunction
from radixlm.lang.global_config import global_config
from radixlm.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from radixlm.lang.state import ProgramState, ProgramStateGroup
from radixlm.lang.tools import tools_prompt

__all__ = [
    "tools_prompt", "CompiledFunction", "CompileError",
    "REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "ChatTemplate", "EngineBackend",
    "OpenAI", "ProgramError", "ProgramState", "ProgramStateGroup", "Runtime", "RuntimeEndpoint",
    "SglFunction", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function",
    "gen", "gen_int", "gen_string", "get_chat_template", "get_server_info",
    "greedy_token_selection", "register_chat_template", "select", "set_default_backend",
    "system", "system_begin", "system_end", "token_length_normalized",
    "unconditional_likelihood_normalized", "user", "user_begin", "user_end", "global_config",
    "image", "video", "separate_reasoning",
]
