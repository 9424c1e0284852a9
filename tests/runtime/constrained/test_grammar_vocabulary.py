"""Token id -> bytes for byte-level BPE (SmolLM2) and SentencePiece-style vocabularies."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from radixlm.runtime.constrained.base import create_grammar_backend
from radixlm.runtime.constrained.vocabulary import token_bytes_table, token_style

VOCAB = 49152
EOS = 2


@pytest.fixture(scope="module")
def smol_table(tokenizer):
    return token_bytes_table(tokenizer, VOCAB, [EOS])


def test_byte_level_tokens_decode_like_the_tokenizer(tokenizer, smol_table):
    assert token_style(tokenizer) == "byte_level"
    for text in [" hello", "\n", '{"', " 北京", "é"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert b"".join(smol_table[i] for i in ids) == text.encode("utf-8")


def test_specials_and_eos_excluded(tokenizer, smol_table):
    assert all(smol_table[i] is None for i in tokenizer.all_special_ids)
    assert smol_table[EOS] is None
    assert sum(data is None for data in smol_table) == len(tokenizer.added_tokens_decoder)


def test_printable_ascii_has_single_byte_tokens(smol_table):
    singles = {data[0] for data in smol_table if data and len(data) == 1}
    assert set(range(0x20, 0x7F)) <= singles


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xE2>": 4, "▁": 5, "a": 6, "b": 7}
    vocab.update({"▁a": 8, "ab": 9, "▁ab": 10, "c": 11})
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b")]
    model = models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True)
    backend = Tokenizer(model)
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def test_sentencepiece_spaces_and_byte_fallback(sentencepiece_tokenizer):
    assert token_style(sentencepiece_tokenizer) == "sentencepiece"
    table = token_bytes_table(sentencepiece_tokenizer, 12, [2])
    assert table[:5] == [None, None, None, b"\n", b"\xe2"]
    assert table[5:] == [b" ", b"a", b"b", b" a", b"ab", b" ab", b"c"]


def test_outlines_backend_on_sentencepiece_vocab(sentencepiece_tokenizer):
    backend = create_grammar_backend("outlines", sentencepiece_tokenizer, 12, [2])
    matcher = backend.compile("regex", "( ab|c)+").matcher()
    for token_id in (10, 11, 5, 9):
        matcher.advance(token_id)
    assert matcher.is_accepting()
