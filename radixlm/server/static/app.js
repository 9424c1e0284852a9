// radixlm's built-in page: a chat playground, the live radix tree and the server's vital signs.
// It talks only to the server's own routes; with --api-key it asks for the key once.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const state = { key: localStorage.getItem("radixlm-key") || "", model: null, history: [],
                series: {}, ttfts: [], treeStream: null };

// -- HTTP -----------------------------------------------------------------------------------------

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}

async function api(path, body) {
  const opts = body === undefined ? { headers: headers(false) }
    : { method: "POST", headers: headers(true), body: JSON.stringify(body) };
  const r = await fetch(path, opts);
  if (r.status === 401) askForKey();
  return r;
}

async function errorMessage(r) {
  try { return (await r.json()).error.message; } catch (_) { return `HTTP ${r.status}`; }
}

// Server-sent events over fetch (EventSource cannot send the Authorization header).
async function readSSE(response, onData, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  while (!(signal && signal.aborted)) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of frame.split("\n")) {
        if (line.startsWith("data: ") && line !== "data: [DONE]") onData(JSON.parse(line.slice(6)));
      }
    }
  }
}

function askForKey() {
  $("key-form").hidden = false;
  setStatus("API key needed", false);
}

function setStatus(text, ok) {
  const s = $("status");
  s.textContent = text;
  s.className = "pill " + (ok ? "ok" : "bad");
}

// -- playground -----------------------------------------------------------------------------------

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function constraint() {
  const mode = $("constrain-mode").value;
  const spec = $("constrain-spec").value.trim();
  if (mode === "none") return {};
  if (!spec) throw new Error(`constrain output: the ${mode} is empty`);
  if (mode === "json_schema") {
    let schema;
    try { schema = JSON.parse(spec); } catch (e) { throw new Error(`JSON schema: ${e.message}`); }
    if (typeof schema !== "object" || schema === null || Array.isArray(schema)) {
      throw new Error("JSON schema: must be a JSON object");
    }
    return { response_format: { type: "json_schema", json_schema: { name: "output", schema } } };
  }
  if (mode === "regex") {
    try { new RegExp(spec); } catch (e) { throw new Error(`regex: ${e.message}`); }
    return { regex: spec };
  }
  const choices = spec.split("\n").map((c) => c.trim()).filter(Boolean);
  const escape = (c) => c.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return { regex: "(" + choices.map(escape).join("|") + ")" };
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

async function send(event) {
  event.preventDefault();
  const text = $("chat-input").value.trim();
  if (!text) return;
  showError("");
  let extra;
  try { extra = constraint(); } catch (e) { showError(e.message); return; }
  const system = $("system").value.trim();
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...state.history,
                    { role: "user", content: text }];
  const body = { model: state.model, messages, stream: true,
                 stream_options: { include_usage: true },
                 temperature: Number($("temperature").value), top_p: Number($("top-p").value),
                 max_tokens: Number($("max-tokens").value), ...extra };
  $("chat-input").value = "";
  addMessage("user", text);
  $("send").disabled = true;
  const start = performance.now();
  try {
    const r = await api("/v1/chat/completions", body);
    if (!r.ok) { showError(await errorMessage(r)); return; }
    const bubble = addMessage("assistant", "");
    const out = { text: "", first: null, usage: null };
    await readSSE(r, (chunk) => {
      if (chunk.error) { showError(chunk.error.message); return; }
      if (chunk.usage) out.usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (out.first === null) out.first = performance.now();
        out.text += delta.content;
        bubble.textContent = out.text;
      }
    });
    state.history.push({ role: "user", content: text }, { role: "assistant", content: out.text });
    bubble.appendChild(statsLine(start, out));
  } catch (e) {
    showError(String(e));
  } finally {
    $("send").disabled = false;
  }
}

function statsLine(start, out) {
  const end = performance.now();
  const span = document.createElement("span");
  span.className = "stats";
  const ttft = out.first === null ? null : (out.first - start) / 1000;
  const tokens = out.usage ? out.usage.completion_tokens : 0;
  const cached = out.usage && out.usage.prompt_tokens_details
    ? out.usage.prompt_tokens_details.cached_tokens : 0;
  const rate = out.first === null || tokens < 2 ? 0 : (tokens - 1) / ((end - out.first) / 1000);
  if (ttft !== null) state.ttfts.push(ttft);
  span.textContent = `TTFT ${ttft === null ? "–" : ttft.toFixed(2) + " s"} · `
    + `${rate.toFixed(1)} tok/s · ${tokens} tokens · ${cached} cached`;
  return span;
}

// -- radix tree -----------------------------------------------------------------------------------

function layout(nodes) {
  const children = new Map(nodes.map((n) => [n.id, []]));
  for (const n of nodes) if (children.has(n.parent)) children.get(n.parent).push(n);
  const root = nodes[0];
  const pos = new Map();
  let leaves = 0;
  const place = (node, depth) => {
    const kids = children.get(node.id);
    if (!kids.length) pos.set(node.id, { x: leaves++, y: depth });
    else {
      kids.forEach((k) => place(k, depth + 1));
      const xs = kids.map((k) => pos.get(k.id).x);
      pos.set(node.id, { x: (Math.min(...xs) + Math.max(...xs)) / 2, y: depth });
    }
  };
  place(root, 0);
  return { pos, children, width: Math.max(leaves, 1), depth: Math.max(...[...pos.values()].map((p) => p.y), 1) };
}

function colour(node, maxAge) {
  if (node.lock_ref > 0) return "#e67e22";
  const fresh = 1 - Math.min(node.age / Math.max(maxAge, 1), 1);
  const light = Math.round(80 - 45 * fresh);
  return `hsl(214, 67%, ${light}%)`;
}

function drawTree(view) {
  const nodes = view.nodes;
  const t = $("tree-totals");
  const hit = (100 * view.cache_hit_rate).toFixed(1) + "%";
  t.innerHTML = `free ${view.free_tokens} · evictable ${view.evictable_tokens} · `
    + `protected ${view.protected_tokens} of ${view.total_tokens} tokens · `
    + `hit rate <b id="hit-rate">${hit}</b>${view.truncated ? " · (first nodes only)" : ""}`;
  const svg = document.createElementNS(SVG, "svg");
  if (nodes.length) {
    const { pos, children, width, depth } = layout(nodes);
    const W = 600, H = 340, px = (p) => 20 + (W - 40) * (p.x + 0.5) / width;
    const py = (p) => 20 + (H - 40) * p.y / depth;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const maxAge = Math.max(...nodes.map((n) => n.age));
    for (const n of nodes) {
      if (!pos.has(n.parent)) continue;
      const a = pos.get(n.parent), b = pos.get(n.id);
      const edge = document.createElementNS(SVG, "line");
      edge.setAttribute("class", "edge");
      edge.setAttribute("x1", px(a)); edge.setAttribute("y1", py(a));
      edge.setAttribute("x2", px(b)); edge.setAttribute("y2", py(b));
      svg.appendChild(edge);
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("x", (px(a) + px(b)) / 2 + 3);
      label.setAttribute("y", (py(a) + py(b)) / 2);
      label.textContent = (n.text || "").replace(/\s+/g, " ").slice(0, 14);
      svg.appendChild(label);
    }
    for (const n of nodes) {
      const p = pos.get(n.id);
      const c = document.createElementNS(SVG, "circle");
      c.setAttribute("class", "node");
      c.setAttribute("cx", px(p)); c.setAttribute("cy", py(p));
      c.setAttribute("r", n.parent === null ? 4 : Math.min(4 + 1.5 * Math.sqrt(n.tokens), 18));
      c.setAttribute("fill", n.parent === null ? "#444" : colour(n, maxAge));
      c.dataset.children = children.get(n.id).length;
      c.dataset.tokens = n.tokens;
      const title = document.createElementNS(SVG, "title");
      title.textContent = n.parent === null ? "root" : n.text;
      c.appendChild(title);
      c.addEventListener("mouseenter", () => {
        $("node-info").textContent = n.parent === null ? "root"
          : `${n.tokens} tokens · lock ${n.lock_ref}${n.salted ? " · salted" : ""}\n${n.text}`;
      });
      svg.appendChild(c);
    }
  }
  $("tree").replaceChildren(svg);
}

async function followTree() {
  try {
    const r = await api("/cache/tree/stream?max_nodes=300&interval=0.5");
    if (!r.ok) { setTimeout(followTree, 3000); return; }
    await readSSE(r, drawTree);
  } catch (_) { /* the server restarted or went away: try again */ }
  setTimeout(followTree, 2000);
}

// -- vital signs ----------------------------------------------------------------------------------

const VITALS = [
  ["running requests", (s) => s.num_running, (v) => v.toFixed(0)],
  ["waiting requests", (s) => s.num_waiting, (v) => v.toFixed(0)],
  ["KV usage", (s) => 100 * s.kv_usage, (v) => v.toFixed(1) + "%"],
  ["throughput tok/s", (s) => s.gen_throughput, (v) => v.toFixed(1)],
  ["TTFT s (this page)", () => state.ttfts.length ? state.ttfts[state.ttfts.length - 1] : 0,
   (v) => v.toFixed(2)],
];

function sparkline(values) {
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 120 28");
  svg.setAttribute("preserveAspectRatio", "none");
  const max = Math.max(...values, 1e-9);
  const line = document.createElementNS(SVG, "polyline");
  line.setAttribute("points", values.map((v, i) => `${(120 * i) / 59},${26 - (24 * v) / max}`).join(" "));
  svg.appendChild(line);
  return svg;
}

async function pollVitals() {
  try {
    const r = await api("/get_server_info");
    if (r.ok) {
      const info = await r.json();
      setStatus("ready", true);
      const rows = VITALS.map(([name, get, fmt]) => {
        const series = (state.series[name] = [...(state.series[name] || []), get(info.stats) || 0].slice(-60));
        const row = document.createElement("div");
        row.className = "spark";
        const label = document.createElement("span");
        label.textContent = name;
        const value = document.createElement("b");
        value.textContent = fmt(series[series.length - 1]);
        row.append(label, sparkline(series), value);
        return row;
      });
      $("sparklines").replaceChildren(...rows);
    } else if (r.status !== 401) {
      setStatus(await errorMessage(r), false);
    }
  } catch (_) {
    setStatus("unreachable", false);
  }
  setTimeout(pollVitals, 2000);
}

// -- start ----------------------------------------------------------------------------------------

async function start() {
  const r = await api("/v1/models");
  if (r.ok) {
    state.model = (await r.json()).data[0].id;
    $("model").textContent = state.model;
  }
  if (r.status === 401) return;
  followTree();
  pollVitals();
}

$("chat-form").addEventListener("submit", send);
$("chat-input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("chat-form").requestSubmit(); }
});
$("clear").addEventListener("click", () => { state.history = []; $("messages").replaceChildren(); });
$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  state.key = $("key-input").value;
  localStorage.setItem("radixlm-key", state.key);
  $("key-form").hidden = true;
  start();
});
start();
