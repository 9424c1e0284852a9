"""radixlm on Ray Serve: ``radixlm serve-ray --num-replicas N [engine flags]``, or
``serve run radixlm.deploy.ray:app num_replicas=2 max_total_tokens=8192`` (and the same
``args`` in a Serve config file, ``deploy/ray/serve-config.yaml``).

Two deployments make one Serve application:

- ``RadixlmReplica``: one radixlm runtime (scheduler and detokenizer processes, tokenizer manager,
  watchdog) per replica. Ray starts, health-checks (``check_health``) and restarts replicas, and
  scales them with ``--autoscaling-config``; a tensor-parallel replica reserves its ranks'
  resources in one placement-group bundle (the ranks are the replica's child processes).
- ``RadixlmIngress``: the server's own FastAPI app (``create_app``: the same routes, errors and
  metrics as ``radixlm serve``) over a ``RayBackend``, behind Ray's HTTP proxy. Calls to the
  replicas go through ``PrefixAffinityRouter`` (prefix affinity, falling back to the least loaded
  replica), or through Ray's default power-of-two router with ``--power-of-two-router``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from radixlm.deploy.ray_manager import RayBackend
from radixlm.deploy.ray_router import PrefixAffinityRouter, Target
from radixlm.runtime.config import ServerArgs
from radixlm.runtime.io_struct import SingleRequest
from radixlm.runtime.launcher import launch
from radixlm.runtime.runtime import Runtime
from radixlm.server.app import create_app
from radixlm.server.cli import build_parser, server_args

PROG = "radixlm serve-ray"
APP_NAME = "radixlm"
INGRESS_MAX_ONGOING = 4096  # NOTE: the ingress only forwards; the replicas' limits apply


@dataclass(frozen=True)
class RayOptions:
    """How Ray Serve runs the replicas (the engine's own options stay in ``ServerArgs``)."""

    num_replicas: int = 1
    autoscaling_config: dict | None = None
    num_cpus_per_replica: float = 1.0
    power_of_two_router: bool = False
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        if self.num_cpus_per_replica < 0:
            raise ValueError(f"num_cpus_per_replica must be >= 0, got {self.num_cpus_per_replica}")
        if self.autoscaling_config is not None and not isinstance(self.autoscaling_config, dict):
            raise ValueError("autoscaling_config must be a JSON object")


class RadixlmReplica:
    """One radixlm runtime; the ingress calls it through a handle."""

    async def __init__(self, args: ServerArgs) -> None:
        backend = await asyncio.get_running_loop().run_in_executor(None, launch, args)
        self.runtime = Runtime.start(args, backend)
        self.replica_id = serve.get_replica_context().replica_id.unique_id

    async def generate(self, req: SingleRequest):
        """First this replica's id, then ``TokenizerManager.generate``'s responses. A cancelled
        call closes the manager's generator, which aborts the request."""
        yield {"replica": self.replica_id}
        async for out in self.runtime.manager.generate(req):
            out["meta_info"]["replica"] = self.replica_id
            yield out

    def abort(self, target: Target, rid: str) -> list[str]:
        return self.runtime.manager.abort(rid)

    async def control(self, target: Target, kind: str, timeout: float, data: dict | None = None):
        out = await self.runtime.manager.control(kind, timeout, data)
        return self.replica_id, out

    def info(self, target: Target) -> dict:
        return self.runtime.backend.info

    def check_health(self) -> None:
        """Ray restarts a replica whose processes died or whose scheduler hung (watchdog)."""
        if not self.runtime.alive:
            reason = self.runtime.manager.dead or self.runtime.backend.dead_reason()
            raise RuntimeError(f"the radixlm runtime is down: {reason}")

    def __del__(self) -> None:
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.manager.close()
            runtime.backend.shutdown()


@serve.ingress()
class RadixlmIngress:
    """The HTTP routes of ``radixlm serve``, served by Ray's proxy, over the replicas."""

    async def __init__(self, replicas: DeploymentHandle, args: ServerArgs) -> None:
        self.args = args
        self.handle = replicas
        self.info = await replicas.info.remote(Target())  # NOTE: waits for a replica to load

    def __serve_build_asgi_app__(self):
        return create_app(self.args, backend=RayBackend(self.args, self.handle, self.info))


def build_app(args: ServerArgs, options: RayOptions = RayOptions()) -> serve.Application:
    """The Serve application for ``args`` (``serve.run(build_app(args, options))``)."""
    replica = serve.deployment(RadixlmReplica).options(**_replica_options(args, options))
    ingress = serve.deployment(RadixlmIngress).options(
        max_ongoing_requests=INGRESS_MAX_ONGOING, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(replica.bind(args), args)


def _replica_options(args: ServerArgs, options: RayOptions) -> dict[str, Any]:
    queued = args.max_queued_requests
    out: dict[str, Any] = {
        "max_ongoing_requests": args.max_running_requests + (queued or args.max_running_requests),
        "ray_actor_options": {"num_cpus": options.num_cpus_per_replica},
        "health_check_period_s": 2.0,
        "health_check_timeout_s": max(30.0, args.watchdog_timeout),
    }
    if queued is not None:
        out["max_queued_requests"] = queued
    if options.autoscaling_config is not None:
        out["autoscaling_config"] = options.autoscaling_config
    else:
        out["num_replicas"] = options.num_replicas
    if not options.power_of_two_router:
        out["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"policy": args.load_balance_method},
        )
    gpus = args.tp_size if _wants_gpus(args) else 0  # NOTE: Ray hides GPUs it did not grant
    if args.tp_size > 1:  # NOTE: the ranks are child processes: one bundle, on one node
        bundle = {"CPU": options.num_cpus_per_replica * args.tp_size, "GPU": gpus}
        out["ray_actor_options"] = {}
        out["placement_group_bundles"] = [{k: v for k, v in bundle.items() if v}]
        out["placement_group_strategy"] = "STRICT_PACK"
    elif gpus:
        out["ray_actor_options"]["num_gpus"] = gpus
    return out


def _wants_gpus(args: ServerArgs) -> bool:
    if args.device == "cuda":
        return True
    auto = args.device == "auto" and ray.is_initialized()
    return auto and ray.cluster_resources().get("GPU", 0) > 0


# -- command line ------------------------------------------------------------------------------

RAY_FLAGS = {
    "num_replicas": (int, 1, "replicas of the engine (ignored with --autoscaling-config)"),
    "autoscaling_config": (json.loads, None, "Ray Serve autoscaling_config, as JSON"),
    "num_cpus_per_replica": (float, 1.0, "logical CPUs Ray reserves for each replica"),
    "ray_address": (str, None, "join this Ray cluster (default: start a local one)"),
}


def parse_ray_args(argv: list[str]) -> tuple[ServerArgs, RayOptions]:
    parser = build_parser(PROG)
    for name, (kind, default, help_text) in RAY_FLAGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                            help=help_text)  # fmt: skip
    parser.add_argument(
        "--power-of-two-router", action="store_true",
        help="Ray's default router instead of radixlm's prefix affinity",
    )
    kwargs = vars(parser.parse_args(argv))
    ray_kwargs = {k: kwargs.pop(k) for k in [*RAY_FLAGS, "power_of_two_router"]}
    args = server_args(kwargs, PROG)
    try:
        return args, RayOptions(**ray_kwargs)
    except ValueError as e:
        raise SystemExit(f"{PROG}: error: {e}") from None


def app(cli_args: dict[str, Any]) -> serve.Application:
    """Serve's application builder: ``serve run radixlm.deploy.ray:app num_replicas=2 ...``
    (values as the flags of ``radixlm serve-ray`` take them)."""
    return build_app(*parse_ray_args(_argv(cli_args)))


def _argv(cli_args: dict[str, Any]) -> list[str]:
    argv = []
    for key, value in cli_args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool) or str(value).lower() in ("true", "false"):
            argv += [flag] if str(value).lower() == "true" else []
        else:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return argv


def main(argv: list[str]) -> int:
    """Start (or join) a Ray cluster, serve until SIGTERM / Ctrl-C, then remove the app."""
    args, options = parse_ray_args(argv)
    ray.init(address=options.ray_address, log_to_driver=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.run(build_app(args, options), name=APP_NAME, route_prefix="/")
        print(f"radixlm is ready at http://{args.host}:{args.port} (Ray Serve)", flush=True)
        stop.wait()
    finally:
        serve.delete(APP_NAME)
        serve.shutdown()
        ray.shutdown()
    return 0
