// The edgefn dashboard: follows /dashboard/stream (SSE, the session cookie) and
// renders each snapshot and the events that arrive. No libraries, no build step.
"use strict";
const MAX_ROWS = 50;
const $ = (id) => document.getElementById(id);
const pct = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(1) + "%");
const num = (x, d = 1) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function fill(table, rows) {
  const body = $(table).tBodies[0];
  body.replaceChildren(...rows.map((cells) => {
    const tr = document.createElement("tr");
    cells.forEach((c) => cell(tr, c));
    return tr;
  }));
}

function chart(series) {
  const svg = $("chart"), w = 600 / series.length, top = Math.max(1, ...series);
  svg.replaceChildren(...series.map((n, i) => {
    const r = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    const h = (110 * n) / top;
    r.setAttribute("x", i * w + 1); r.setAttribute("width", Math.max(1, w - 2));
    r.setAttribute("y", 118 - h); r.setAttribute("height", h);
    const t = document.createElementNS("http://www.w3.org/2000/svg", "title");
    t.textContent = n + " req/s"; r.appendChild(t);
    return r;
  }));
}

function snapshot(s) {
  $("rps").textContent = s.rps;
  $("requests").textContent = s.requests;
  $("error-rate").textContent = pct(s.error_rate);
  $("http-hit").textContent = pct(s.cache.http.hit_rate);
  $("ai-hit").textContent = pct(s.cache.ai.hit_rate);
  $("ttft").textContent = num(s.ai.ttft_p50);
  const w = s.worker || {};
  $("tps").textContent = num(s.ai.tokens_per_s ?? w.tokens_per_second);
  $("busy").textContent = pct(w.busy_fraction);
  chart(s.series);
  fill("functions", s.functions.map((f) => [f.function, f.requests, f.errors,
    num(f.p50, 2), num(f.p95, 2), num(f.p99, 2)]));
  fill("actions", [
    ...Object.entries(s.waf).map(([k, n]) => ["waf", k, n]),
    ...Object.entries(s.ratelimit).map(([k, n]) => ["ratelimit", k, n])]);
  fill("versions", s.versions.map((v) => [v.name, v.version, v.abi,
    v.canary ? v.canary.version + " at " + v.canary.percent + "%" : ""]));
  $("state").textContent = "live · " + new Date(s.now * 1000).toLocaleTimeString();
}

function events(list) {
  const body = $("events").tBodies[0];
  for (const e of list) {
    const tr = document.createElement("tr");
    cell(tr, new Date(e.ts * 1000).toLocaleTimeString());
    cell(tr, e.status, e.status >= 500 ? "err" : "");
    cell(tr, e.method);
    cell(tr, e.path + (e.query ? "?" + e.query : ""));
    cell(tr, e.target || "");
    cell(tr, num(e.duration_ms, 2));
    cell(tr, Object.entries(e.stages_ms || {}).map(([k, v]) => k + " " + num(v, 2)).join(", "));
    cell(tr, JSON.stringify(e.decisions || {}));
    body.insertBefore(tr, body.firstChild);
    if (e.pop) { $("pop").textContent = e.pop + " (" + e.tier + ")"; $("geo").textContent = e.geo || "–"; }
  }
  while (body.rows.length > MAX_ROWS) body.deleteRow(-1);
}

// the login token is used up: keep it out of the address bar (and out of a reload)
if (location.search) history.replaceState(null, "", "/dashboard");

const source = new EventSource("/dashboard/stream");
source.addEventListener("snapshot", (m) => snapshot(JSON.parse(m.data)));
source.addEventListener("events", (m) => events(JSON.parse(m.data)));
source.onerror = () => {
  if (source.readyState === EventSource.CLOSED) {
    // refused (401: the PoP restarted, and sessions live in its memory): the browser
    // will not try again, so say so instead of showing stale figures as live
    $("state").textContent = "session ended: run `edgefn dashboard` for a new login link";
    document.body.classList.add("ended");
  } else {
    $("state").textContent = "disconnected; retrying…";
  }
};
