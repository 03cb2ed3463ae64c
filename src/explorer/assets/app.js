// The explorer page: asks the server (the diffattn library) for the four views of a head and
// draws them. Nothing is computed here except colours and layout.
"use strict";

const VIEWS = ["map1", "map2", "diff", "standard"];
const NAMES = { map1: "Map 1", map2: "Map 2", diff: "Differential", standard: "Standard" };
const BAR_COLORS = { map1: "#1f77b4", map2: "#ff7f0e", diff: "#d62728", standard: "#2ca02c" };
// Anchors of viridis (probabilities) and of a blue-white-red map (signed values, white at 0),
// the same as the library's PNG heatmaps.
const VIRIDIS = [[68, 1, 84], [72, 40, 120], [62, 73, 137], [49, 104, 142], [38, 130, 142],
                 [31, 158, 137], [53, 183, 121], [110, 206, 88], [181, 222, 43], [253, 231, 37]];
const BWR = [[33, 102, 172], [103, 169, 207], [209, 229, 240], [247, 247, 247],
             [253, 219, 199], [239, 138, 98], [178, 24, 43]];

const state = { data: null, row: null, pending: null, inflight: false, geometry: {},
                models: [], learned: true };
const $ = (id) => document.getElementById(id);

function ramp(stops, t) {
  t = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(Math.floor(t), stops.length - 2), f = t - i;
  const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function colorScale(view, matrix) {
  let lo = Infinity, hi = -Infinity;
  for (const r of matrix) for (const v of r) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  const signed = view === "diff" && state.data.mode === "signed";
  if (signed) {
    const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    return { signed, lo: -m, hi: m, color: (v) => ramp(BWR, (v / m + 1) / 2) };
  }
  const top = hi > 0 ? hi : 1;
  return { signed, lo: 0, hi: top, color: (v) => ramp(VIRIDIS, v / top) };
}

// The views a response has (a standard model has only "standard").
function present() { return VIEWS.filter((v) => state.data.views[v]); }

function modelIndex() {
  const s = $("source").value;
  return s.startsWith("model:") ? Number(s.slice(6)) : null;
}

function request() {
  const mode = document.querySelector("input[name=mode]:checked").value;
  const m = modelIndex();
  if (m !== null) {
    const body = { source: "model", model: m, prompt: $("prompt").value, mode,
                   layer: Number($("layer").value), head: Number($("head").value) };
    if (!state.learned) body.lambda = Number($("lambda").value);
    return body;
  }
  const body = {
    source: $("source").value,
    lambda: Number($("lambda").value),
    mode,
    causal: $("causal").checked,
  };
  if (body.source === "random") {
    body.length = Math.round(Number($("length").value));
    body.seed = Math.round(Number($("seed").value));
  }
  return body;
}

// One request at a time; while one is out, only the latest wanted state is kept.
function refresh() {
  state.pending = request();
  if (state.inflight) return;
  const body = state.pending;
  state.pending = null;
  state.inflight = true;
  document.body.dataset.ready = "0";
  fetch("/api/views", { method: "POST", headers: { "Content-Type": "application/json" },
                        body: JSON.stringify(body) })
    .then((r) => r.json().then((j) => ({ ok: r.ok, j })))
    .then(({ ok, j }) => {
      if (!ok) throw new Error(j.error || "request failed");
      $("error").hidden = true;
      state.data = j;
      if (state.row !== null && state.row >= j.tokens.length) state.row = null;
      render();
    })
    .catch((e) => { $("error").textContent = e.message; $("error").hidden = false; })
    .finally(() => {
      state.inflight = false;
      if (state.pending) refresh();
      else document.body.dataset.ready = "1";
    });
}

function fmt(v) { return (Math.abs(v) < 5e-5 ? 0 : v).toFixed(4); }

function drawHeatmap(canvas, view) {
  const d = state.data, T = d.tokens.length, m = d.views[view];
  const ctx = canvas.getContext("2d");
  ctx.font = "12px DejaVu Sans, sans-serif";
  const labelW = Math.min(90, Math.max(...d.tokens.map((t) => ctx.measureText(t).width)) + 8);
  const cell = Math.max(8, Math.min(56, Math.floor(300 / T)));
  const left = labelW, top = 4, gw = cell * T;
  canvas.width = left + gw + 84;
  canvas.height = top + gw + labelW + 6;
  ctx.font = "12px DejaVu Sans, sans-serif";
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const scale = colorScale(view, m);
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      ctx.fillStyle = scale.color(m[i][j]);
      ctx.fillRect(left + j * cell, top + i * cell, cell, cell);
    }
  }
  if (state.row !== null) {
    ctx.strokeStyle = "#000";
    ctx.lineWidth = 2;
    ctx.strokeRect(left + 1, top + state.row * cell + 1, gw - 2, cell - 2);
  }
  ctx.fillStyle = "#222";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  const every = cell >= 12 ? 1 : Math.ceil(12 / cell);
  for (let i = 0; i < T; i += every) ctx.fillText(d.tokens[i], left - 4, top + i * cell + cell / 2);
  for (let j = 0; j < T; j += every) {
    ctx.save();
    ctx.translate(left + j * cell + cell / 2, top + gw + 4);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(d.tokens[j], 0, 0);
    ctx.restore();
  }
  // Colour bar with its end values.
  const bx = left + gw + 10, bh = gw;
  for (let y = 0; y < bh; y++) {
    ctx.fillStyle = scale.color(scale.hi - (scale.hi - scale.lo) * (y + 0.5) / bh);
    ctx.fillRect(bx, top + y, 12, 1);
  }
  ctx.fillStyle = "#222";
  ctx.textAlign = "left";
  ctx.fillText(fmt(scale.hi).replace(/0+$/, "").replace(/\.$/, ""), bx + 15, top + 6);
  ctx.fillText(fmt(scale.lo).replace(/0+$/, "").replace(/\.$/, ""), bx + 15, top + bh - 6);
  if (scale.signed) ctx.fillText("0", bx + 15, top + bh / 2);
  state.geometry[view] = { left, top, cell, T };
  Object.assign(canvas.dataset, { gridLeft: left, gridTop: top, cell, tokens: T });
}

function drawBars() {
  const canvas = $("bars"), ctx = canvas.getContext("2d"), d = state.data;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  if (state.row === null) return;
  const shown = present();
  const T = d.tokens.length, rows = shown.map((v) => d.views[v][state.row]);
  let lo = 0, hi = 0;
  for (const r of rows) for (const v of r) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (hi === lo) hi = lo + 1;
  const left = 50, right = 150, top = 10, bottom = 60;
  const pw = canvas.width - left - right, ph = canvas.height - top - bottom;
  const y = (v) => top + ph - (v - lo) / (hi - lo) * ph;
  ctx.font = "11px DejaVu Sans, sans-serif";
  ctx.strokeStyle = "#ccc";
  ctx.fillStyle = "#222";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (let k = 0; k <= 4; k++) {
    const v = lo + (hi - lo) * k / 4;
    ctx.beginPath(); ctx.moveTo(left, y(v)); ctx.lineTo(left + pw, y(v)); ctx.stroke();
    ctx.fillText((Math.abs(v) < 5e-3 ? 0 : v).toFixed(2), left - 4, y(v));
  }
  const group = pw / T, bw = Math.max(2, group * 0.8 / shown.length);
  shown.forEach((view, k) => {
    ctx.fillStyle = BAR_COLORS[view];
    for (let j = 0; j < T; j++) {
      const v = rows[k][j], x = left + j * group + group * 0.1 + k * bw;
      ctx.fillRect(x, Math.min(y(v), y(0)), bw - 1, Math.abs(y(v) - y(0)));
    }
  });
  ctx.strokeStyle = "#222";
  ctx.beginPath(); ctx.moveTo(left, y(0)); ctx.lineTo(left + pw, y(0)); ctx.stroke();
  ctx.fillStyle = "#222";
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const every = group >= 30 ? 1 : Math.ceil(30 / group);
  for (let j = 0; j < T; j += every) ctx.fillText(d.tokens[j], left + (j + 0.5) * group, top + ph + 6);
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  shown.forEach((view, k) => {
    ctx.fillStyle = BAR_COLORS[view];
    ctx.fillRect(left + pw + 16, top + 10 + k * 20, 14, 12);
    ctx.fillStyle = "#222";
    ctx.fillText(NAMES[view], left + pw + 36, top + 16 + k * 20);
  });
}

function drawTable() {
  const t = $("row-table"), d = state.data;
  t.innerHTML = "";
  if (state.row === null) return;
  const head = t.insertRow();
  head.appendChild(document.createElement("th")).textContent = "view";
  for (const tok of d.tokens) head.appendChild(document.createElement("th")).textContent = tok;
  head.appendChild(document.createElement("th")).textContent = "sum";
  for (const view of present()) {
    const tr = t.insertRow();
    tr.dataset.view = view;
    tr.insertCell().textContent = NAMES[view];
    let sum = 0;
    d.views[view][state.row].forEach((v, j) => {
      const td = tr.insertCell();
      td.textContent = fmt(v);
      td.dataset.value = v;
      td.dataset.key = j;
      if (v < 0) td.className = "neg";
      sum += v;
    });
    tr.insertCell().textContent = fmt(sum);
  }
}

function render() {
  const d = state.data;
  const lam = d.lambda_varies ? "&lambda;<sub>t</sub>" : d.lambda.toFixed(2);
  let cap = d.mode === "signed"
    ? "Differential: A<sub>1</sub> &minus; " + lam + " A<sub>2</sub> (signed)"
    : "Differential: max(A<sub>1</sub> &minus; " + lam + " A<sub>2</sub>, 0), renormalised";
  if (d.source === "model") cap += d.lambda_learned ? (d.lambda_varies ? ", learned per token (mean " +
    d.lambda.toFixed(2) + ")" : ", learned") : ", from the slider";
  $("diff-caption").innerHTML = cap;
  $("standard-caption").innerHTML = d.source !== "model" ? "Standard: softmax(s QK<sup>T</sup>), full width"
    : d.views.map1 ? "Standard view: softmax([q<sub>1</sub>;q<sub>2</sub>]&middot;[k<sub>1</sub>;k<sub>2</sub>] / &radic;(2D))"
    : "Softmax attention (the model's one map)";
  if (d.source === "model" && d.lambda_learned) {
    $("lambda").value = d.lambda;
    $("lambda-value").textContent = d.lambda.toFixed(2);
  }
  for (const v of VIEWS) {
    $("fig-" + v).hidden = !d.views[v];
    if (d.views[v]) drawHeatmap($("view-" + v), v);
  }
  $("selected-row").textContent = state.row === null ? "none (click a row)" : d.tokens[state.row];
  document.body.dataset.row = state.row === null ? "" : String(state.row);
  drawBars();
  drawTable();
  Object.assign(document.body.dataset, { lambda: String(d.lambda), mode: d.mode,
                                         causal: String(d.causal), source: d.source,
                                         layer: d.source === "model" ? String(d.layer) : "",
                                         head: d.source === "model" ? String(d.head) : "",
                                         learned: String(!!d.lambda_learned) });
}

function cellAt(canvas, ev) {
  const g = state.geometry[canvas.dataset.view];
  if (!g) return null;
  const r = canvas.getBoundingClientRect();
  const x = ev.clientX - r.left - g.left, y = ev.clientY - r.top - g.top;
  const i = Math.floor(y / g.cell), j = Math.floor(x / g.cell);
  return i >= 0 && j >= 0 && i < g.T && j < g.T ? { i, j } : null;
}

for (const v of VIEWS) {
  const c = $("view-" + v);
  c.addEventListener("click", (ev) => {
    const at = cellAt(c, ev);
    if (at && state.data && state.data.views[v]) { state.row = at.i; render(); }
  });
  c.addEventListener("mousemove", (ev) => {
    const at = cellAt(c, ev), tip = $("tooltip");
    if (!at || !state.data) { tip.hidden = true; return; }
    const d = state.data;
    tip.textContent = `${NAMES[v]}: ${d.tokens[at.i]} \u2192 ${d.tokens[at.j]} = ${fmt(d.views[v][at.i][at.j])}`;
    tip.style.left = ev.clientX + 12 + "px";
    tip.style.top = ev.clientY + 12 + "px";
    tip.hidden = false;
  });
  c.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
}

// A model's layer and head choices (head -1: the mean over the layer's heads).
function fillModelControls() {
  const m = state.models[modelIndex()];
  const layer = $("layer"), head = $("head");
  layer.innerHTML = "";
  for (let l = 0; l < m.layers; l++) layer.add(new Option(String(l), String(l)));
  layer.value = String(m.layers - 1);
  head.innerHTML = "";
  for (let h = 0; h < m.heads; h++) head.add(new Option(String(h), String(h)));
  head.add(new Option("mean", "-1"));
  $("prompt").value = m.example_prompt;
  $("prompt").maxLength = 2048;
  state.learned = true;
}

$("lambda").addEventListener("input", () => {
  $("lambda-value").textContent = Number($("lambda").value).toFixed(2);
  state.learned = false;
  refresh();
});
$("source").addEventListener("change", () => {
  const model = modelIndex() !== null;
  $("random-controls").hidden = $("source").value !== "random";
  $("model-controls").hidden = !model;
  $("causal").disabled = model;
  if (model) fillModelControls();
  state.row = null;
  refresh();
});
for (const el of [$("layer"), $("head")]) {
  el.addEventListener("change", () => { state.learned = true; refresh(); });
}
$("prompt").addEventListener("change", () => { state.row = null; refresh(); });
$("learned").addEventListener("click", () => { state.learned = true; refresh(); });
for (const el of [$("length"), $("seed"), $("causal"), ...document.querySelectorAll("input[name=mode]")]) {
  el.addEventListener("change", refresh);
}
$("lambda-value").textContent = Number($("lambda").value).toFixed(2);
fetch("/api/info").then((r) => r.json()).then((info) => {
  state.models = info.models || [];
  state.models.forEach((m, i) => {
    $("source").add(new Option(`Model: ${m.name} (${m.kind})`, "model:" + i));
  });
}).finally(refresh);
