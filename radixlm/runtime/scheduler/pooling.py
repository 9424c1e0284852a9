"""Embedding requests: a prompt's final-normed hidden states pooled into one vector.

An embedding request is a prefill with no output token (``max_new_tokens`` 0) whose steps keep
the hidden states (``ForwardBatch.keep_hidden``). Each chunk adds its rows as it is computed,
so chunked prefill and retraction need nothing else:

- ``last``: the last token's state. With causal attention it is the one token that saw the whole
  input (Qwen3-Embedding, e5-mistral, GTE-Qwen pool this way). A cached prefix is reused: only
  the uncached tail is computed, and the last token always is.
- ``mean``: the average over every token (sentence-transformers' mean pooling). It needs every
  token's state, so such a request takes nothing from the radix cache (``Req.max_match_len``).

With ``normalize`` (the default, as OpenAI's embeddings) the vector is divided by its L2 norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from radixlm.runtime.scheduler.admission import Chunk
from radixlm.runtime.scheduler.req import Req


def pool_chunks(chunks: list[Chunk], hidden: torch.Tensor) -> None:
    """Add each embedding request's rows of ``hidden`` (one per token of the step, chunk after
    chunk) to what it has pooled; called before the step moves ``kv_len``."""
    start = 0
    for chunk in chunks:
        if chunk.req.pooling is not None:
            _add(chunk.req, hidden[start : start + chunk.num_tokens])
        start += chunk.width


def _add(req: Req, rows: torch.Tensor) -> None:
    done = req.kv_len + len(rows) == req.seq_len
    if req.pooling == "mean":
        total = rows.sum(0)
        req.pooled = total if req.pooled is None else req.pooled + total
        if done:
            req.pooled = req.pooled / req.seq_len
    elif done:
        req.pooled = rows[-1]
    if done and req.normalize:
        req.pooled = F.normalize(req.pooled, dim=0)
