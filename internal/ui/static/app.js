// edgeflow's web view: renders each snapshot the server sends on /events (server-sent events).
// Plain JS and SVG, no dependencies, nothing fetched but this origin's /events.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const palette = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d", "#dc2626", "#4b5563", "#ca8a04"];

function el(tag, attrs, text) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") e.style.cssText = v; // CSSOM, which the page's CSP allows (a style attribute it would not)
    else e.setAttribute(k, v);
  }
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmt(x, digits) {
  return Number(x).toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 1 : digits });
}

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

function renderCost(s) {
  const body = document.getElementById("cost-body");
  clear(body);
  if (!s.publication) { body.textContent = "no plan yet"; return; }
  const rr = s.round_robin_cost_ms;
  const max = Math.max(s.cost_ms, rr, 1e-9);
  body.appendChild(el("div", {}, `${s.policy} plan: ${fmt(s.cost_ms)} ms·req/s`));
  body.appendChild(el("div", { class: "bar plan", style: `width:${(100 * s.cost_ms / max).toFixed(1)}%` }));
  if (rr >= 0) {
    body.appendChild(el("div", {}, `round-robin: ${fmt(rr)} ms·req/s`));
    body.appendChild(el("div", { class: "bar rr", style: `width:${(100 * rr / max).toFixed(1)}%` }));
    if (rr > 0) {
      const d = 100 * (rr - s.cost_ms) / rr;
      body.appendChild(el("div", { class: d >= 0 ? "gain" : "loss", id: "cost-saving" },
        d >= 0 ? `${fmt(d)} % less latency than round-robin` : `${fmt(-d)} % more latency than round-robin`));
    }
  } else {
    body.appendChild(el("div", {}, "round-robin: unknown"));
  }
}

function renderPush(s) {
  const body = document.getElementById("push-body");
  clear(body);
  if (!s.publication) { body.textContent = "nothing pushed yet"; return; }
  const p = s.push;
  const at = p.at ? new Date(p.at).toLocaleTimeString() : "";
  body.appendChild(el("div", {}, `publication ${s.publication} at ${at}`));
  const kinds = Object.entries(p.resources || {}).filter(([, n]) => n > 0).map(([t, n]) => `${t.toUpperCase()} ${n}`);
  body.appendChild(el("div", {}, `pushed: ${kinds.length ? kinds.join(", ") : "no client's resources changed"} · ` +
    `${p.streams} xDS ${p.streams === 1 ? "stream" : "streams"} open`));
  let answers = "waiting for the clients' answers (ACK or NACK)";
  if (p.converged) answers = `answered (ACK or NACK) by every client pushed to, after ${fmt(p.converged_after_ms)} ms`;
  if (kinds.length === 0) answers = "nothing to answer: no client was pushed this publication";
  if (p.streams === 0) answers = "no xDS client connected";
  body.appendChild(el("div", { class: p.converged ? "ok" : "", id: "push-answers" }, answers));
  body.appendChild(el("div", { class: p.nacks ? "degraded-item" : "" }, `NACKs: ${p.nacks}`));
}

function renderDegraded(s) {
  const body = document.getElementById("degraded-body");
  clear(body);
  if (!s.degraded || s.degraded.length === 0) { body.appendChild(el("span", { class: "ok" }, "none: every input is fresh")); return; }
  const ul = el("ul", {});
  for (const d of s.degraded) {
    const li = el("li", { class: "degraded-item", "data-input": d.input });
    li.appendChild(el("b", {}, d.input + ": "));
    li.appendChild(document.createTextNode(d.message));
    ul.appendChild(li);
  }
  body.appendChild(ul);
}

function renderLatency(s) {
  const t = document.getElementById("latency");
  clear(t);
  const ms = new Map(s.latency.map(l => [l.from + "\u0000" + l.to, l.ms]));
  // Per zone, the rows and columns are the zones the latency list names; else the nodes.
  const perZone = s.latency_per === "zone";
  const names = perZone ? [...new Set(s.latency.map(l => l.from))] : s.nodes.map(n => n.name);
  const head = el("tr", {});
  head.appendChild(el("th", {}, perZone ? "zone from \\ to" : "from \\ to"));
  for (const n of names) head.appendChild(el("th", {}, n));
  t.appendChild(head);
  for (const a of names) {
    const tr = el("tr", perZone ? { "data-zone": a } : { "data-node": a });
    tr.appendChild(el("th", {}, a));
    for (const b of names) {
      const v = ms.get(a + "\u0000" + b);
      tr.appendChild(el("td", { "data-from": a, "data-to": b }, v === undefined ? "—" : fmt(v, 2)));
    }
    t.appendChild(tr);
  }
}

function renderEdges(s, edgeColor) {
  const t = document.getElementById("edges");
  clear(t);
  const head = el("tr", {});
  for (const h of ["call edge", "cost ms·req/s", "routes (caller → callee: share, latency)"]) head.appendChild(el("th", {}, h));
  t.appendChild(head);
  for (const e of s.edges) {
    const tr = el("tr", { "data-edge": `${e.from}→${e.to}` });
    const name = el("td", {});
    name.appendChild(el("span", { style: `color:${edgeColor.get(e.from + "→" + e.to)}` }, "■ "));
    name.appendChild(document.createTextNode(`${e.from} → ${e.to}`));
    tr.appendChild(name);
    tr.appendChild(el("td", {}, fmt(e.cost_ms)));
    const routes = e.routes.map(r => `${r.caller} → ${r.callee}: ${fmt(100 * r.fraction)} %, ${fmt(r.latency_ms, 2)} ms`);
    tr.appendChild(el("td", { class: "routes" }, routes.join(" · ")));
    t.appendChild(tr);
  }
}

function renderGraph(s, serviceColor, edgeColor) {
  const svg = document.getElementById("graph");
  clear(svg);
  const legend = document.getElementById("legend");
  clear(legend);
  for (const [name, c] of serviceColor) {
    const sp = el("span", {});
    sp.appendChild(el("i", { style: `background:${c};height:10px;width:10px;border-radius:5px` }));
    sp.appendChild(document.createTextNode(name));
    legend.appendChild(sp);
  }
  for (const [name, c] of edgeColor) {
    const sp = el("span", {});
    sp.appendChild(el("i", { style: `background:${c}` }));
    sp.appendChild(document.createTextNode(name.replace("→", " → ")));
    legend.appendChild(sp);
  }
  const n = s.nodes.length;
  if (n === 0) { svg.setAttribute("viewBox", "0 0 400 40"); svg.appendChild(el("svg:text", { x: 10, y: 24 }, "no topology yet")); return; }
  const cols = n <= 8 ? Math.min(n, 4) : Math.ceil(Math.sqrt(n));
  const boxW = 230, gapX = 70, gapY = 50, rowH = 26, pad = 20;
  const maxPods = Math.max(1, ...s.nodes.map(x => x.pods.length));
  const boxH = 44 + maxPods * rowH;
  const rows = Math.ceil(n / cols);
  const W = pad * 2 + cols * boxW + (cols - 1) * gapX, H = pad * 2 + rows * boxH + (rows - 1) * gapY;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.style.maxHeight = Math.max(H, 200) + "px";
  const pos = new Map();
  const nodesLayer = el("svg:g", {}), routesLayer = el("svg:g", {}), podsLayer = el("svg:g", {});
  s.nodes.forEach((node, i) => {
    const x = pad + (i % cols) * (boxW + gapX), y = pad + Math.floor(i / cols) * (boxH + gapY);
    const g = el("svg:g", { "data-node": node.name });
    g.appendChild(el("svg:rect", { class: "node-box", x, y, width: boxW, height: boxH, rx: 8 }));
    g.appendChild(el("svg:text", { class: "node-name", x: x + 10, y: y + 18 }, node.name));
    if (node.locality) g.appendChild(el("svg:text", { x: x + boxW - 10, y: y + 18, "text-anchor": "end", fill: "#5c6670" }, node.locality));
    nodesLayer.appendChild(g);
    node.pods.forEach((p, j) => {
      const cx = x + boxW / 2, cy = y + 40 + j * rowH;
      pos.set(p.name, { x: cx, y: cy, node: i });
      const pg = el("svg:g", { "data-pod": p.name, "data-pod-node": node.name });
      pg.appendChild(el("svg:circle", { class: "pod", cx, cy, r: 8, fill: serviceColor.get(p.service) || "#888" }));
      pg.appendChild(el("svg:text", { x: cx + 13, y: cy + 4 }, p.name));
      podsLayer.appendChild(pg);
    });
  });
  for (const e of s.edges) {
    const color = edgeColor.get(e.from + "→" + e.to);
    for (const r of e.routes) {
      const a = pos.get(r.caller), b = pos.get(r.callee);
      if (!a || !b || r.fraction <= 0) continue;
      let d;
      if (a.node === b.node) {
        const bulge = 30 + Math.abs(b.y - a.y) / 4;
        d = `M ${a.x} ${a.y} C ${a.x - bulge} ${a.y}, ${b.x - bulge} ${b.y}, ${b.x} ${b.y}`;
      } else {
        const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2, dx = b.x - a.x, dy = b.y - a.y;
        const len = Math.hypot(dx, dy) || 1, k = 0.12 * len;
        d = `M ${a.x} ${a.y} Q ${mx - dy / len * k} ${my + dx / len * k} ${b.x} ${b.y}`;
      }
      const path = el("svg:path", { class: "route", d, stroke: color, "stroke-width": (1 + 12 * r.fraction).toFixed(2),
        "data-edge": `${e.from}→${e.to}`, "data-caller": r.caller, "data-callee": r.callee, "data-fraction": r.fraction });
      path.appendChild(el("svg:title", {}, `${r.caller} → ${r.callee}: ${fmt(100 * r.fraction)} % (${fmt(r.latency_ms, 2)} ms)`));
      routesLayer.appendChild(path);
    }
  }
  svg.appendChild(nodesLayer);
  svg.appendChild(routesLayer);
  svg.appendChild(podsLayer);
}

function render(s) {
  const serviceColor = new Map(), edgeColor = new Map();
  s.services.forEach((sv, i) => serviceColor.set(sv.name, palette[i % palette.length]));
  s.edges.forEach((e, i) => edgeColor.set(e.from + "→" + e.to, palette[(i + 3) % palette.length]));
  document.getElementById("publication").textContent = s.publication
    ? `publication ${s.publication} · policy ${s.policy} · ${s.nodes.length} nodes · ${s.edges.length} call edges`
    : "waiting for the first publication";
  document.body.dataset.publication = String(s.publication);
  renderCost(s);
  renderPush(s);
  renderDegraded(s);
  renderLatency(s);
  renderEdges(s, edgeColor);
  renderGraph(s, serviceColor, edgeColor);
}

function connect() {
  const status = document.getElementById("status");
  const es = new EventSource("events");
  es.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  es.onerror = () => { status.textContent = "reconnecting…"; status.className = "status down"; };
  es.onmessage = ev => {
    try { render(JSON.parse(ev.data)); } catch (err) { status.textContent = "bad snapshot: " + err; status.className = "status down"; }
  };
}

connect();
