"""Counters the scheduler keeps for /metrics, get_server_info and its periodic log line."""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.scheduler.req import Req


@dataclass
class SchedulerStats:
    steps: int = 0
    forward_tokens: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    retractions: int = 0
    mask_wait_s: float = 0.0  # time sampling waited for grammar masks (filled during forwards)
    finished_by_reason: Counter = field(default_factory=Counter)
    _recent: deque = field(default_factory=lambda: deque(maxlen=64))  # (time, generated)

    def step(self, num_tokens: int, num_sampled: int) -> None:
        self.steps += 1
        self.forward_tokens += num_tokens
        self.generated_tokens += num_sampled
        self._recent.append((time.monotonic(), num_sampled))

    def finished(self, req: Req) -> None:
        self.finished_by_reason[req.finish.kind.value if req.finish else "unknown"] += 1

    @property
    def gen_throughput(self) -> float:
        """Generated tokens per second over the recent steps."""
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1][0] - self._recent[0][0]
        return sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "forward_tokens": self.forward_tokens,
            "generated_tokens": self.generated_tokens,
            "prompt_tokens": self.prompt_tokens,
            "retractions": self.retractions,
            "mask_wait_s": self.mask_wait_s,
            "finished_by_reason": dict(self.finished_by_reason),
            "gen_throughput": self.gen_throughput,
        }
