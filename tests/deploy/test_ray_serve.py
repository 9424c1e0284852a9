"""radixlm on a real local Ray cluster: 2 replicas of the embedded model behind Ray Serve's HTTP
proxy. Skipped without the ``ray`` extra; ``-m "not ray"`` skips them too."""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from radixlm.deploy.ray import APP_NAME, RayOptions, build_app  # noqa: E402
from radixlm.runtime.config import ServerArgs  # noqa: E402
from tests.server.server_helpers import free_port  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

GROUPS, PER_GROUP, PREFIX_WORDS = 4, 8, 200
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work number night "
    "point home water room mother area money story fact month lot right study book eye job word"
).split()  # NOTE: one token each, so a prefix is ~200 tokens
# NOTE: one replica's cache holds two groups' prefixes, not four: with affinity each replica
# serves two groups; round robin sends every group everywhere and the prefixes evict each other
ARGS = ServerArgs(num_threads=1, max_total_tokens=560, context_length=512, random_seed=0)


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    ray.init(num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)  # fmt: skip
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(ARGS, RayOptions(num_replicas=2)), name=APP_NAME, route_prefix="/")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture()
def client(cluster):
    with httpx.Client(base_url=cluster, timeout=120) as c:
        yield c


def workload(seed: int = 0) -> list[tuple[int, str]]:
    """(group, prompt) pairs: each group's prompts share a long prefix; shuffled."""
    rng = random.Random(seed)
    prefixes = [
        f"Document {g}: " + " ".join(rng.choice(WORDS) for _ in range(PREFIX_WORDS))
        for g in range(GROUPS)
    ]
    pairs = [(g, f"{prefixes[g]}\nQuestion {i}: what is item {i}?")
             for g in range(GROUPS) for i in range(PER_GROUP)]  # fmt: skip
    rng.shuffle(pairs)
    return pairs


def run_workload(client: httpx.Client) -> tuple[dict[int, list[str]], float]:
    """Send the workload 4 at a time; the replicas each group landed on, and its hit rate."""
    assert client.post("/flush_cache").status_code == 200
    before = client.get("/get_server_info").json()["stats"]
    placed: dict[int, list[str]] = {g: [] for g in range(GROUPS)}

    def send(pair: tuple[int, str]) -> None:
        group, prompt = pair
        r = client.post("/generate", json={
            "text": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
        })  # fmt: skip
        assert r.status_code == 200, r.text
        placed[group].append(r.json()["meta_info"]["replica"])

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(send, workload()))
    after = client.get("/get_server_info").json()["stats"]
    hits, queried = (after[k] - before[k] for k in ("hit_tokens", "queried_tokens"))
    return placed, hits / queried


def test_openai_client_through_the_ray_proxy(cluster):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=f"{cluster}/v1", api_key="none", max_retries=0)
    model = api.models.list().data[0].id
    chat = api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8,
        temperature=0,
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 8
    chunks = list(api.completions.create(
        model=model, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True,
    ))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        api.completions.create(model=model, prompt="x", max_tokens=-1)


def test_probes_and_merged_stats(client):
    assert client.get("/health").status_code == 200
    assert client.get("/ready").status_code == 200
    stats = stats_of_both_replicas(client)  # NOTE: control requests reach every replica
    assert stats["max_total_tokens"] == 2 * ARGS.max_total_tokens


def test_prefix_groups_stay_on_one_replica(client):
    placed, _ = run_workload(client)
    for group, replicas in placed.items():
        top = max(set(replicas), key=replicas.count)
        assert replicas.count(top) >= 0.9 * PER_GROUP, (group, replicas)
    assert len({r for rs in placed.values() for r in rs}) == 2  # and both replicas work


def test_a_killed_replica_loses_no_request_and_comes_back(client):
    before = replica_ids()
    results: list[int] = []

    def send(i: int) -> None:
        r = client.post("/generate", json={
            "text": f"Count to ten, attempt {i}:", "sampling_params": {"max_new_tokens": 24},
        })  # fmt: skip
        results.append(r.status_code)

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(send, i) for i in range(12)]
        time.sleep(0.5)
        victim = sorted(before)[0]
        ray.kill(ray.get_actor(before[victim], namespace="serve"), no_restart=True)
        for f in futures:
            f.result()
    assert results == [200] * 12  # NOTE: non-streaming: none had output yet, so all retried
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        now = replica_ids()
        if len(now) == 2 and victim not in now and client.get("/ready").status_code == 200:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"Ray did not replace replica {victim}: {replica_ids()}")
    stats_of_both_replicas(client)


def test_prefix_affinity_hit_rate_beats_round_robin(cluster, client):
    _, affinity = run_workload(client)
    serve.run(build_app(ARGS.replace(load_balance_method="round_robin"),
                        RayOptions(num_replicas=2)), name=APP_NAME, route_prefix="/")  # fmt: skip
    _, round_robin = run_workload(client)
    print(f"hit rate: prefix affinity {affinity:.1%}, round robin {round_robin:.1%}")
    assert affinity >= 1.5 * round_robin, (affinity, round_robin)


def stats_of_both_replicas(client: httpx.Client, within: float = 60.0) -> dict:
    """The merged stats once they include both replicas. The ingress learns Ray's replica set
    by long poll, so a replica that Serve reports running joins the broadcast a moment later."""
    deadline = time.monotonic() + within
    while True:
        stats = client.get("/get_server_info").json()["stats"]
        if len(stats["replicas"]) == 2 or time.monotonic() > deadline:
            assert len(stats["replicas"]) == 2, stats["replicas"]
            return stats
        time.sleep(0.5)


def replica_ids() -> dict[str, str]:
    """The running replicas of the engine deployment: unique id -> actor name."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    out = {}
    for name in names:
        if name.startswith("SERVE_REPLICA::") and "#RadixlmReplica#" in name:
            out[name.rsplit("#", 1)[1]] = name
    status = serve.status().applications[APP_NAME].deployments["RadixlmReplica"]
    running = status.replica_states.get("RUNNING", 0)
    return out if running == len(out) else {}
