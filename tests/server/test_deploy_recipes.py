"""The deployment recipes under deploy/ parse, pass only flags the CLI knows (with values it
accepts), and probe the routes the server has."""

from __future__ import annotations

import os

import pytest
import yaml

from radixlm.server.app import create_app
from radixlm.server.cli import parse_args

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy")
RECIPES = ["kubernetes/radixlm.yaml", "kserve/radixlm-runtime.yaml"]


def _containers(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return pod.get("containers", [])


def _probe_paths(container: dict) -> list[str]:
    return [
        container[kind]["httpGet"]["path"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        if kind in container
    ]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_flags_and_probes_match_the_server(recipe, tmp_path):
    with open(os.path.join(ROOT, recipe)) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    containers = [c for d in docs for c in _containers(d)]
    assert containers, recipe
    routes = set(create_app(parse_args([])).openapi()["paths"])
    for container in containers:
        # NOTE: KServe fills {{.Name}}; /mnt/models exists in the pod, here a stand-in does
        args = [str(a).replace("/mnt/models", str(tmp_path)) for a in container.get("args", [])]
        server_args = parse_args(args)  # SystemExit on an unknown flag or a bad value
        assert server_args.port == 30000
        paths = _probe_paths(container)
        assert "/ready" in paths and "/health" in paths, recipe
        assert set(paths) <= routes


def test_the_ray_serve_config_builds_with_flags_the_cli_knows():
    pytest.importorskip("ray")
    from radixlm.deploy.ray import _argv, parse_ray_args

    with open(os.path.join(ROOT, "ray", "serve-config.yaml")) as f:
        config = yaml.safe_load(f)
    (app,) = config["applications"]
    assert app["import_path"] == "radixlm.deploy.ray:app"
    args, options = parse_ray_args(_argv(app["args"]))  # SystemExit on an unknown flag
    assert options.num_replicas == 2 and args.max_total_tokens == 32768
    auto = {"min_replicas": 1, "max_replicas": 4}
    _, options = parse_ray_args(_argv({**app["args"], "autoscaling_config": auto}))
    assert options.autoscaling_config == auto


def test_the_dockerfile_serves_on_the_port_the_recipes_use():
    with open(os.path.join(ROOT, "Dockerfile")) as f:
        text = f.read()
    assert '"--port", "30000"' in text and "torch==2.13.0" in text
