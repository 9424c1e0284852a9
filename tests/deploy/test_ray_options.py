"""``radixlm serve-ray``'s flags and the Serve options they become (no cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from radixlm.deploy.ray import _replica_options, parse_ray_args  # noqa: E402
from radixlm.deploy.ray_router import PrefixAffinityRouter  # noqa: E402
from radixlm.server.cli import main  # noqa: E402


def test_engine_and_ray_flags_parse_together():
    args, options = parse_ray_args([
        "--num-replicas", "3", "--max-running-requests", "8", "--load-balance-method",
        "least_load", "--num-cpus-per-replica", "2",
    ])  # fmt: skip
    assert (options.num_replicas, options.num_cpus_per_replica) == (3, 2.0)
    out = _replica_options(args, options)
    assert out["num_replicas"] == 3 and out["ray_actor_options"] == {"num_cpus": 2.0}
    assert out["max_ongoing_requests"] == 16  # running + as many waiting
    router = out["request_router_config"]
    assert router.request_router_kwargs == {"policy": "least_load"}
    assert PrefixAffinityRouter.__name__ in str(router.request_router_class)


def test_autoscaling_power_of_two_and_tensor_parallel_options():
    args, options = parse_ray_args([
        "--autoscaling-config", '{"min_replicas": 1, "max_replicas": 4}',
        "--power-of-two-router", "--tp-size", "2", "--max-queued-requests", "10",
    ])  # fmt: skip
    out = _replica_options(args, options)
    assert out["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4}
    assert "num_replicas" not in out and "request_router_config" not in out
    assert out["placement_group_bundles"] == [{"CPU": 2.0}]
    assert out["max_queued_requests"] == 10
    args, options = parse_ray_args(["--device", "cuda", "--tp-size", "2"])
    assert _replica_options(args, options)["placement_group_bundles"] == [{"CPU": 2.0, "GPU": 2}]
    args, options = parse_ray_args(["--device", "cuda"])
    assert _replica_options(args, options)["ray_actor_options"] == {"num_cpus": 1.0, "num_gpus": 1}


@pytest.mark.parametrize("argv, message", [
    (["--num-replicas", "0"], "num_replicas must be >= 1"),
    (["--max-running-requests", "0"], "max_running_requests must be >= 1"),
    (["--autoscaling-config", "[1]"], "autoscaling_config must be a JSON object"),
])  # fmt: skip
def test_bad_flags_end_with_one_line(argv, message):
    with pytest.raises(SystemExit, match=f"radixlm serve-ray: error: {message}"):
        main(["serve-ray", *argv])


def test_unknown_flag_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["serve-ray", "--replicas", "2"])
    assert "unrecognized arguments: --replicas" in capsys.readouterr().err
