"""The built-in web page in a real headless Chromium (the system's; Playwright downloads
nothing), and the read-only ``/cache/tree`` routes behind its cache view."""

from __future__ import annotations

import shutil
import threading

import pytest
from server_helpers import launch_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SYSTEM = "You are a careful assistant. This long system prompt is shared by every chat. " * 4


# -- /cache/tree ---------------------------------------------------------------------------------


def test_cache_tree_bounds_nodes_and_shows_text(tiny_client):
    assert tiny_client.post("/flush_cache").status_code == 200
    for word in ["apple", "banana", "cherry", "damson", "elder"]:
        body = {"text": f"{word} pie recipe", "sampling_params": {"max_new_tokens": 1}}
        r = tiny_client.post("/generate", json=body)
        assert r.status_code == 200
    tree = tiny_client.get("/cache/tree", params={"max_nodes": 3}).json()
    assert tree["truncated"] and len(tree["nodes"]) == 4  # the root and three nodes
    full = tiny_client.get("/cache/tree").json()
    assert not full["truncated"]
    n = len(full["nodes"]) - 1  # NOTE: the exact count is not truncated, one less is
    assert not tiny_client.get("/cache/tree", params={"max_nodes": n}).json()["truncated"]
    assert tiny_client.get("/cache/tree", params={"max_nodes": n - 1}).json()["truncated"]
    root = full["nodes"][0]
    assert root["parent"] is None and root["tokens"] == 0
    texts = [n["text"] for n in full["nodes"] if n["parent"] == root["id"]]
    assert any(t.startswith("apple") for t in texts) and len(texts) == 5
    assert all(n["lock_ref"] == 0 for n in full["nodes"])
    assert full["evictable_tokens"] == sum(n["tokens"] for n in full["nodes"])
    assert tiny_client.post("/flush_cache").status_code == 200
    assert len(tiny_client.get("/cache/tree").json()["nodes"]) == 1  # evicted: only the root


def test_a_running_request_shows_as_locked(tiny_client):
    body = {"text": "locked prefix for the tree view", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}  # fmt: skip
    seen: list[dict] = []

    def watch() -> None:
        for _ in range(100):
            nodes = tiny_client.get("/cache/tree").json()["nodes"]
            locked = [n for n in nodes if n["lock_ref"] > 0]
            if locked:
                seen.extend(locked)
                return

    with tiny_client.stream("POST", "/generate", json=body) as r:
        thread = threading.Thread(target=watch)
        thread.start()
        for _ in r.iter_lines():
            if not thread.is_alive():
                break
        thread.join()
    assert seen and seen[0]["text"].startswith("locked prefix")


def test_the_tree_needs_the_key_and_the_page_does_not(tiny_llama):
    server = launch_server(tiny_llama, "--api-key", "sekrit")
    try:
        with server.client() as client:
            assert client.get("/cache/tree").status_code == 401
            assert client.get("/cache/tree/stream").status_code == 401
            ok = client.get("/cache/tree", headers={"Authorization": "Bearer sekrit"})
            assert ok.status_code == 200 and ok.json()["nodes"][0]["parent"] is None
            assert client.get("/").status_code == 200
            assert client.get("/static/app.js").status_code == 200
    finally:
        server.stop()


# -- the page in Chromium ----------------------------------------------------------------------


@pytest.fixture()
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the web extra is not installed")
    if CHROMIUM is None:
        pytest.skip("no Chromium on this machine: apt-get install chromium (Debian) to run it")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.problems = []
    page.on("pageerror", lambda e: page.problems.append(f"exception: {e}"))
    page.on("console", lambda m: page.problems.append(m.text) if m.type == "error" else None)
    page.goto(url)
    page.wait_for_function("document.getElementById('status').textContent === 'ready'")
    return page


def chat(page, text: str) -> str:
    done = page.locator(".msg.assistant .stats").count()
    page.fill("#chat-input", text)
    page.click("#send")
    page.wait_for_function(
        f"document.querySelectorAll('.msg.assistant .stats').length > {done}", timeout=60_000
    )
    return page.locator(".msg.assistant").last.inner_text()


def hit_rate(page) -> float:
    return float(page.inner_text("#hit-rate").rstrip("%"))


def test_playground_cache_view_and_vitals(browser, tiny_llama, tmp_path):
    server = launch_server(tiny_llama, "--max-total-tokens", "8192")
    try:
        page = open_page(browser, server.url + "/")
        assert page.problems == [], page.problems  # NOTE: a clean load
        page.screenshot(path=tmp_path / "loaded.png")
        # a streamed chat reply with its TTFT, speed and cached tokens
        page.click("#playground details summary")
        page.fill("#system", SYSTEM)
        page.fill("#max-tokens", "12")
        reply = chat(page, "Hello, who are you?")
        assert "TTFT" in reply and "tok/s" in reply and "cached" in reply
        page.screenshot(path=tmp_path / "chat.png")
        # a second chat sharing the system prompt: a branching node, and the hit rate rises
        before = hit_rate(page)
        page.click("#clear")
        chat(page, "A different question entirely")
        page.wait_for_function(
            "[...document.querySelectorAll('#tree circle.node')]"
            ".some(c => Number(c.dataset.children) >= 2)", timeout=15_000,
        )  # fmt: skip
        page.wait_for_function(f"parseFloat(document.getElementById('hit-rate').textContent)"
                               f" > {before}", timeout=15_000)  # fmt: skip
        page.hover("#tree circle.node >> nth=1")
        assert "tokens" in page.inner_text("#node-info")
        assert page.locator("#sparklines .spark").count() == 5
        page.screenshot(path=tmp_path / "tree.png")
        # constrained output: a spec that does not parse, then one the server refuses
        page.click("#constrain summary")
        page.select_option("#constrain-mode", "json_schema")
        page.fill("#constrain-spec", '{"type": "object", ')
        page.fill("#chat-input", "x")
        page.click("#send")
        assert "JSON schema" in page.inner_text("#error")
        page.fill("#constrain-spec", '{"type": "object", "properties": {"a": {"type": "nope"}}}')
        page.click("#send")
        page.wait_for_function(
            "!document.getElementById('error').hidden && "
            "document.getElementById('error').textContent.includes('nope')"
        )
        page.screenshot(path=tmp_path / "bad_schema.png")
        js_errors = [p for p in page.problems if "400" not in p]  # NOTE: the refused request
        assert js_errors == [], js_errors
    finally:
        server.stop()


def test_the_page_asks_for_the_key(browser, tiny_llama, tmp_path):
    server = launch_server(tiny_llama, "--api-key", "sekrit")
    try:
        page = browser.new_page()
        page.goto(server.url + "/")
        page.wait_for_selector("#key-input", state="visible")
        page.fill("#key-input", "sekrit")
        page.click("#key-form button")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        page.wait_for_selector("#tree circle.node")  # the tree route answered with the key
        page.screenshot(path=tmp_path / "with_key.png")
    finally:
        server.stop()
