"""Prometheus metrics under vLLM's names with the prefix ``radixlm:``.

Scheduler counters and gauges are read from a stats snapshot taken when ``/metrics`` is scraped;
latency histograms are observed in the server as tokens arrive.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

PREFIX = "radixlm:"
LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0,
)
GAUGES = {
    "num_requests_running": ("num_running", "Requests in the running batch."),
    "num_requests_waiting": ("num_waiting", "Requests waiting to be scheduled."),
    "kv_cache_usage_perc": ("kv_usage", "Fraction of KV slots in use (1 = full)."),
}
COUNTERS = {
    "prefix_cache_queries_total": ("queried_tokens", "Prompt tokens looked up in the radix cache."),
    "prefix_cache_hits_total": ("hit_tokens", "Prompt tokens found in the radix cache."),
    "prompt_tokens_total": ("prompt_tokens", "Prompt tokens of finished requests."),
    "prompt_logprob_cache_hits_total": (
        "prompt_logprob_hit_tokens", "Prompt logprobs read from the radix cache, not computed.",
    ),
    "prompt_logprob_top_n_misses_total": (
        "prompt_logprob_top_n_misses",
        "Cached prompt tokens computed again: the request asked for more top logprobs than kept.",
    ),
    "generation_tokens_total": ("generated_tokens", "Tokens generated."),
    "num_preemptions_total": ("retractions", "Requests retracted to free KV memory."),
}

DISK = {  # --kv-disk-cache only
    "kv_disk_hits_total": ("disk_hit_tokens", CounterMetricFamily, "Prompt tokens from disk."),
    "kv_disk_read_bytes_total": ("disk_bytes_read", CounterMetricFamily, "Bytes of KV read."),
    "kv_disk_skipped_tokens_total": (
        "disk_skipped_tokens", CounterMetricFamily,
        "Prompt tokens on disk computed again, because that has been faster than loading them.",
    ),
    "kv_disk_written_bytes_total": (
        "disk_bytes_written", CounterMetricFamily, "Bytes of KV written.",
    ),
    "kv_disk_load_seconds_total": (
        "disk_load_s", CounterMetricFamily, "Time spent loading KV from disk.",
    ),
    "kv_disk_usage_bytes": ("disk_bytes", GaugeMetricFamily, "Bytes the disk tier holds."),
}

SPEC = {  # --speculative-algorithm only
    "spec_decode_num_drafts_total": ("spec_steps", CounterMetricFamily, "Drafts verified."),
    "spec_decode_num_draft_tokens_total": (
        "spec_draft_tokens", CounterMetricFamily, "Draft tokens verified.",
    ),
    "spec_decode_num_accepted_tokens_total": (
        "spec_accepted_tokens", CounterMetricFamily, "Draft tokens accepted.",
    ),
}


class _StatsCollector:
    """Exposes the latest scheduler stats snapshot as gauges and counters."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        labels = {"model_name": self.model_name}
        for name, (key, doc) in GAUGES.items():
            yield self._family(GaugeMetricFamily, name, doc, labels, self.stats.get(key, 0))
        for name, (key, doc) in COUNTERS.items():
            yield self._family(CounterMetricFamily, name, doc, labels, self.stats.get(key, 0))
        for marker, families in (("disk_blocks", DISK), ("spec_steps", SPEC)):
            if marker in self.stats:
                for name, (key, kind, doc) in families.items():
                    yield self._family(kind, name, doc, labels, self.stats[key])
        if "spec_accept_lengths" in self.stats:
            yield self._acceptance(labels)
        success = CounterMetricFamily(
            PREFIX + "request_success_total", "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason, count in sorted(self.stats.get("finished_by_reason", {}).items()):
            success.add_metric([self.model_name, reason], count)
        yield success

    def _acceptance(self, labels: dict[str, str]) -> Metric:
        """Draft tokens accepted per verified draft, as a histogram with one bucket per
        length (the scheduler counts each length)."""
        counts = {int(k): v for k, v in self.stats["spec_accept_lengths"].items()}
        family = HistogramMetricFamily(
            PREFIX + "spec_decode_acceptance_length", "Draft tokens accepted per verified draft.",
            labels=list(labels),
        )
        buckets, total = [], 0
        for length in range(max(counts, default=0) + 1):
            total += counts.get(length, 0)
            buckets.append((str(float(length)), total))
        buckets.append(("+Inf", total))
        family.add_metric(list(labels.values()), buckets,
                          sum_value=sum(k * v for k, v in counts.items()))  # fmt: skip
        return family

    @staticmethod
    def _family(kind, name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
        family = kind(PREFIX + name, doc, labels=list(labels))
        family.add_metric(list(labels.values()), float(value or 0))
        return family


class ServerMetrics:
    """One registry per app (no module-level state)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._stats = _StatsCollector(model_name)
        self.registry.register(self._stats)
        self.histograms = {
            kind: Histogram(
                PREFIX + name, doc, ["model_name"], registry=self.registry, buckets=LATENCY_BUCKETS
            ).labels(model_name)
            for kind, name, doc in (
                ("ttft", "time_to_first_token_seconds", "Time to the first generated token."),
                ("itl", "inter_token_latency_seconds", "Time between consecutive tokens."),
                ("e2e", "e2e_request_latency_seconds", "Time from arrival to the last token."),
            )
        }

    def observe(self, kind: str, seconds: float) -> None:
        """Record one latency sample: ``kind`` is ttft, itl or e2e."""
        self.histograms[kind].observe(seconds)

    def render(self, stats: dict[str, Any] | None) -> bytes:
        """The exposition text; ``stats`` replaces the snapshot when given."""
        if stats is not None:
            self._stats.stats = stats
        return generate_latest(self.registry)
