"""Token id -> the bytes it stands for, built locally from a Hugging Face tokenizer.

Two token spellings are understood, picked by ``token_style``: byte-level BPE (GPT-2's
byte-to-unicode alphabet, e.g. ``Ġ`` for a space) and SentencePiece (``▁`` for a space,
``<0xNN>`` byte-fallback tokens). Special tokens map to None, except EOS tokens which the
grammar backends treat separately.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from outlines_core import Vocabulary

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return {ch: b for b, ch in mapping.items()}


def byte_level_bytes(token: str) -> bytes:
    """Bytes of a byte-level BPE token (``Ġhello`` -> ``b" hello"``)."""
    table = _byte_decoder()
    if all(ch in table for ch in token):
        return bytes(table[ch] for ch in token)
    return token.encode("utf-8")


def sentencepiece_bytes(token: str) -> bytes:
    """Bytes of a SentencePiece token (``▁hello`` -> ``b" hello"``, ``<0x0A>`` -> ``b"\\n"``)."""
    fallback = _BYTE_FALLBACK.fullmatch(token)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


TOKEN_STYLES: dict[str, Callable[[str], bytes]] = {
    "byte_level": byte_level_bytes,
    "sentencepiece": sentencepiece_bytes,
}


def token_style(tokenizer: Any) -> str:
    """``byte_level`` or ``sentencepiece``: from the fast tokenizer's decoder, else its vocab."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        decoder = json.dumps(json.loads(backend.to_str()).get("decoder"))
        if "ByteLevel" in decoder:
            return "byte_level"
        if "ByteFallback" in decoder or "▁" in decoder:
            return "sentencepiece"
    vocab = tokenizer.get_vocab()
    return "sentencepiece" if "<0x0A>" in vocab or "▁" in vocab else "byte_level"


def token_bytes_table(
    tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]
) -> list[bytes | None]:
    """``table[id]``: the bytes token ``id`` decodes to; None for special, EOS and unused ids."""
    to_bytes = TOKEN_STYLES[token_style(tokenizer)]
    added = getattr(tokenizer, "added_tokens_decoder", {})
    skip = set(getattr(tokenizer, "all_special_ids", [])) | set(eos_token_ids)
    skip |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    table: list[bytes | None] = [None] * vocab_size
    for token, token_id in tokenizer.get_vocab().items():
        if token_id >= vocab_size or token_id in skip:
            continue
        text = added[token_id].content if token_id in added else None
        data = text.encode("utf-8") if text is not None else to_bytes(token)
        table[token_id] = data or None
    return table


def outlines_vocabulary(table: Sequence[bytes | None], eos_token_id: int) -> Vocabulary:
    """An outlines-core ``Vocabulary`` from a token bytes table (EOS kept out of the map)."""
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, data in enumerate(table):
        if data is not None:
            by_bytes.setdefault(data, []).append(token_id)
    return Vocabulary(eos_token_id, by_bytes)
