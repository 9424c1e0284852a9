"""Ray Serve's request router for radixlm replicas: prefix affinity with the ``--dp-size`` policies.

Ray calls ``choose_replicas`` for every call through a handle to the replica deployment (in the
caller's process: the ingress). A generate call carries its prompt's token ids, and the policy of
``runtime/distributed/router.py`` (``cache_aware`` by default) picks the replica whose routed
history shares the longest prefix with it, or the least loaded one when loads drift apart. Calls
that carry a ``Target`` (aborts and control requests) go where it says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from radixlm.runtime.distributed.router import BALANCE_THRESHOLD, Router
from radixlm.runtime.io_struct import SingleRequest


@dataclass(frozen=True)
class Target:
    """Where a non-generate call goes: the replica ``replica``, else any replica not in
    ``exclude`` (else any replica: a broadcast stops when a replica answers twice)."""

    replica: str | None = None
    exclude: frozenset[str] = frozenset()


class PrefixAffinityRouter(RequestRouter):
    """Routes generate calls with a ``Router``; counts them in flight until Ray reports them
    completed."""

    def initialize_state(
        self, policy: str = "cache_aware", balance_threshold: int = BALANCE_THRESHOLD
    ) -> None:
        self.router = Router([], policy, balance_threshold)
        self.in_flight: dict[str, str] = {}  # Ray's internal request id -> replica

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        arg = _first_arg(pending_request)
        if isinstance(arg, Target):
            if arg.replica in by_id:
                return [[by_id[arg.replica]]]
            rest = [r for key, r in by_id.items() if key not in arg.exclude]
            return [rest or candidate_replicas]
        ids = arg.input_ids if isinstance(arg, SingleRequest) else None
        if not ids:
            return [candidate_replicas]  # NOTE: Ray takes the shortest queue among them
        key = self.router.choose(ids, list(by_id))
        self.router.remember(ids, key)
        return [[by_id[key]]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        arg = _first_arg(pending_request)
        if isinstance(arg, SingleRequest) and arg.input_ids:
            self.router.started(replica_id.unique_id)
            self.in_flight[pending_request.metadata.internal_request_id] = replica_id.unique_id

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        replica = self.in_flight.pop(internal_request_id, None)
        if replica is not None:
            self.router.done(replica)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.router.sync(r.replica_id.unique_id for r in replicas)


def _first_arg(pending_request: PendingRequest | None) -> Any:
    if pending_request is None or not pending_request.args:
        return None
    return pending_request.args[0]
