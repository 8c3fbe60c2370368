// speedlimit web calculator: reads the controls, asks POST /api/curve (one call per change, debounced),
// renders the cards, the memory bar and two Plotly charts, and mirrors the state in the URL query string.
"use strict";

const BITS = [2, 3, 4, 5, 6, 8, 16];
// engine: the serving-engine profile (GET /api/engines); "" leaves it unset, i.e. the API's default (llama.cpp).
// kv: "" leaves it unset, i.e. the engine's default KV format (llama.cpp: fp16; TensorRT-LLM with fp8 weights: fp8).
const DEFAULTS = { model: "llama-3.1-8b", hardware: "h100-sxm", engine: "", weights: "16", kv: "", batch: 1, prompt: 512, output: 1000, tp: 1, pp: 1, dp: 1, ep: 1, ideal: false };
// Parallelism beyond tp stays out of the URL at its default, so that shared links read as before.
const PARALLEL = ["pp", "dp", "ep"];
const DEBOUNCE_MS = 16;
const $ = (id) => document.getElementById(id);

// Test/inspection hook: how many results were drawn and whether a request is in flight.
// renders: results drawn (cards); cardSeq/chartSeq: the request each was drawn from (charts follow on the next frame).
window.speedlimit = { renders: 0, pending: false, last: null, cardSeq: 0, chartSeq: 0, lastMs: null, lastFetchMs: null, lastChartMs: null,
  simRenders: 0, simPending: false, simLast: null, simErrors: 0 };

let seq = 0;
let timer = null;
let controller = null;

// ---------------------------------------------------------------- formatting
function fmtNum(x) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  const a = Math.abs(x);
  if (a >= 1000) return Math.round(x).toLocaleString("en-US");
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  return x.toPrecision(3);
}
function fmtBytes(b) {
  if (b === null || b === undefined || !isFinite(b)) return "–";
  const units = [["TB", 1e12], ["GB", 1e9], ["MB", 1e6], ["kB", 1e3]];
  for (const [u, v] of units) if (Math.abs(b) >= v) return fmtNum(b / v) + " " + u;
  return fmtNum(b) + " B";
}
function fmtSeconds(s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  if (s < 1e-3) return fmtNum(s * 1e6) + " µs";
  if (s < 1) return fmtNum(s * 1e3) + " ms";
  if (s < 120) return fmtNum(s) + " s";
  return fmtNum(s / 60) + " min";
}
// A count with an SI prefix and its unit, one space before the prefix: "989 TFLOP/s", "145 GFLOP".
function fmtSI(x, unit) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  for (const [prefix, scale] of [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]]) if (Math.abs(x) >= scale) return fmtNum(x / scale) + " " + prefix + unit;
  return fmtNum(x) + (unit ? " " + unit : "");
}
// Whole numbers (batch sizes, counts): "87", "1,024"; never "87.0".
function fmtInt(x) {
  if (x === null || x === undefined || !isFinite(x)) return "–";
  return Math.round(x).toLocaleString("en-US");
}

// ---------------------------------------------------------------- state <-> controls <-> URL
function batchFromRange() { return Math.max(1, Math.round(Math.pow(2, parseFloat($("batch-range").value)))); }

function weightsValue() {
  const format = $("weights-format").value;
  return format || String(BITS[parseInt($("weights-bits").value, 10)]);
}

function readState() {
  return {
    model: $("model").value,
    hardware: $("hardware").value,
    engine: $("engine").value,
    weights: weightsValue(),
    kv: $("kv").value,
    batch: parseInt($("batch").value, 10),
    prompt: parseInt($("prompt").value, 10),
    output: parseInt($("output").value, 10),
    tp: parseInt($("tp").value, 10),
    pp: parseInt($("pp").value, 10),
    dp: parseInt($("dp").value, 10),
    ep: parseInt($("ep").value, 10),
    ideal: $("ideal").checked,
  };
}

// Select `value` in `select`; a value it has no option for gets one, labelled as given, so that the request carries
// it and the API's answer (a result, or an error on the page) shows, never a blank or silently different choice.
function selectValue(select, value, label) {
  if (!value) return;
  const found = Array.from(select.options).find((o) => o.value === value);
  if (!found) {
    const option = document.createElement("option");
    option.value = value;
    option.textContent = label || value;
    option.dataset.fromUrl = "1";
    select.appendChild(option);
  }
  select.value = value;
}

const normalize = (name) => String(name).trim().toLowerCase().replace(/[_\s]+/g, "-");
let modelAliases = new Map();  // normalized name or alias -> catalog name

function writeState(state) {
  if (state.model) {
    const key = modelAliases.get(normalize(state.model));
    selectValue($("model"), key || state.model, `${state.model} (as given)`);
  }
  if (state.hardware) selectValue($("hardware"), state.hardware, `${state.hardware} (as given)`);
  if (state.engine) selectValue($("engine"), state.engine, `${state.engine} (as given)`);
  else $("engine").value = "";
  const bitsIndex = BITS.indexOf(Number(state.weights));
  if (bitsIndex >= 0) { $("weights-bits").value = bitsIndex; $("weights-format").value = ""; }
  else selectValue($("weights-format"), String(state.weights), `${state.weights} (as given)`);
  if (state.kv) selectValue($("kv"), String(state.kv), `${state.kv} (as given)`);
  else $("kv").value = "";
  $("batch").value = state.batch;
  $("batch-range").value = Math.log2(Math.max(1, state.batch));
  $("prompt").value = state.prompt;
  $("output").value = state.output;
  $("tp").value = state.tp;
  for (const key of PARALLEL) $(key).value = state[key];
  $("ideal").checked = !!state.ideal;
  syncLabels();
}

function stateFromUrl() {
  const q = new URLSearchParams(window.location.search);
  const state = { ...DEFAULTS };
  for (const key of ["model", "hardware", "engine", "weights", "kv"]) if (q.has(key)) state[key] = q.get(key);
  for (const key of ["batch", "prompt", "output", "tp", ...PARALLEL]) if (q.has(key) && isFinite(parseInt(q.get(key), 10))) state[key] = parseInt(q.get(key), 10);
  if (q.has("ideal")) state.ideal = ["1", "true", "yes", "on"].includes(q.get("ideal").toLowerCase());
  return state;
}

// The serving view's controls, kept in the URL beside the estimate's (only what differs from the defaults).
const SIM_DEFAULTS = { sim_load: "concurrency", sim_values: "", sim_engine: "", sim_max_seqs: "", slo_ttft: "", slo_tpot: "" };
const SIM_IDS = { sim_load: "sim-load", sim_values: "sim-values", sim_engine: "sim-engine", sim_max_seqs: "sim-max-seqs", slo_ttft: "sim-slo-ttft", slo_tpot: "sim-slo-tpot" };

function readSimState() {
  const state = {};
  for (const [key, id] of Object.entries(SIM_IDS)) state[key] = $(id).value.trim();
  return state;
}

function simStateFromUrl() {
  const q = new URLSearchParams(window.location.search);
  const state = { ...SIM_DEFAULTS };
  for (const key of Object.keys(SIM_DEFAULTS)) if (q.has(key)) state[key] = q.get(key).slice(0, 200);
  return state;
}

function writeSimState(state) {
  for (const [key, id] of Object.entries(SIM_IDS)) {
    if ($(id).tagName === "SELECT") selectValue($(id), state[key] || SIM_DEFAULTS[key], `${state[key]} (as given)`);
    else $(id).value = state[key];
  }
}

function stateToUrl(state) {
  const q = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) {
    if (key === "ideal") { if (value) q.set("ideal", "1"); }
    else if (key === "engine" || key === "kv") { if (value) q.set(key, value); }
    else if (PARALLEL.includes(key)) { if (value !== 1) q.set(key, String(value)); }
    else q.set(key, String(value));
  }
  for (const [key, value] of Object.entries(readSimState())) if (value !== SIM_DEFAULTS[key]) q.set(key, value);
  const usingConfig = $("config").value.trim() !== "";
  if (usingConfig) q.set("config", "pasted");  // the config itself stays on this page
  window.history.replaceState(null, "", "?" + q.toString());
}

function syncLabels() {
  const format = $("weights-format").value;
  $("weights-label").textContent = format ? format : BITS[parseInt($("weights-bits").value, 10)] + " bits";
  $("batch-label").textContent = $("batch").value;
}

// ---------------------------------------------------------------- requests
function requestBody(state) {
  const body = { ...state };
  if (!body.engine) delete body.engine;  // unset: the API's default engine profile
  if (!body.kv) delete body.kv;  // unset: that engine's default KV format
  const text = $("config").value.trim();
  if (text) {
    let config;
    try { config = JSON.parse(text); } catch (e) { throw new Error("the pasted config.json is not valid JSON: " + e.message); }
    body.config = config;
    body.model = "pasted config.json";
  }
  return body;
}

function scheduleUpdate() {
  syncLabels();
  window.speedlimit.pending = true;
  clearTimeout(timer);
  timer = setTimeout(update, DEBOUNCE_MS);
  scheduleServing();
}

async function update() {
  const mySeq = ++seq;
  const state = readState();
  stateToUrl(state);
  let body;
  try { body = requestBody(state); } catch (e) { showError(e.message); window.speedlimit.pending = false; return; }
  if (controller) controller.abort();
  controller = new AbortController();
  const started = performance.now();
  try {
    const response = await fetch("/api/curve", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: controller.signal,
    });
    const data = await response.json();
    if (mySeq !== seq) return;
    if (!response.ok) { showError(data.detail || ("HTTP " + response.status)); return; }
    const fetched = performance.now();
    showError(null);
    render(data, mySeq);
    Object.assign(window.speedlimit, { lastMs: performance.now() - started, lastFetchMs: fetched - started });
    scheduleCharts(data, mySeq, started);
  } catch (e) {
    if (e.name === "AbortError") return;
    if (mySeq === seq) showError("request failed: " + e.message);
  } finally {
    if (mySeq === seq) window.speedlimit.pending = false;
  }
}

function showError(message) {
  const box = $("error");
  box.hidden = !message;
  box.textContent = message || "";
  $("results").querySelector(".cards").classList.toggle("stale", !!message);
}

// ---------------------------------------------------------------- rendering
function render(data, mySeq) {
  const e = data.estimate;
  const tok = $("decode-tok-s");
  tok.textContent = fmtNum(e.decode_tok_s);
  tok.dataset.value = String(e.decode_tok_s);
  $("itl").textContent = fmtSeconds(e.itl_s);
  $("reply-tokens").textContent = e.output.toLocaleString("en-US");
  $("reply-s").textContent = fmtSeconds(e.reply_s);
  $("reply-s").dataset.value = String(e.reply_s);
  $("e2e").textContent = fmtSeconds(e.e2e_s);
  $("bytes-per-token").textContent = fmtBytes(e.bytes_per_token);
  $("bytes-per-token").dataset.value = String(e.bytes_per_token);
  $("flops-per-token").textContent = fmtSI(e.flops_per_token, "FLOP");
  $("ttft").textContent = fmtSeconds(e.ttft_s);
  $("throughput").textContent = fmtNum(e.throughput_tok_s);
  $("throughput").dataset.value = String(e.throughput_tok_s);
  $("regime").textContent = e.regime;
  $("regime-sub").textContent = e.critical_batch === null ? "decode never turns compute-bound" : `compute-bound from batch ${fmtInt(Math.ceil(e.critical_batch))}`;
  renderMemory(e);
  $("basis-text").textContent = `${e.model} on ${e.hardware}, weights ${e.weights} (${fmtNum(e.weight_bits)} bits), KV ${e.kv}, ${e.mode} mode: `
    + `bandwidth ${fmtBytes(e.bandwidth_Bps)}/s × ${e.bw_efficiency}, peak ${e.flops === null ? "unknown" : fmtSI(e.flops, "FLOP/s")} × ${e.flops_efficiency}, `
    + `step overhead ${fmtSeconds(e.step_overhead_s)}.`
    + (e.threads === null || e.threads === undefined ? "" : ` CPU: ${e.bandwidth_basis}.`);
  renderBasis(e.efficiency_basis || "");
  window.speedlimit.last = data;
  window.speedlimit.cardSeq = mySeq;
  window.speedlimit.renders += 1;
}

// The efficiency basis: one list item per clause, web addresses as links. Built with DOM calls and textContent only
// (nothing is parsed as HTML); a link is made only for an http(s) address, or a bare host/path given an https:// scheme.
const ADDRESS = /\b((?:https?:\/\/)?(?:[a-z0-9-]+\.)+[a-z]{2,}\/[^\s(),;]*[^\s(),;.])/gi;
function renderBasis(text) {
  const list = $("basis-list");
  list.replaceChildren();
  const items = text.split(/;\s+|\.\s+(?=[A-Z])/).map((t) => t.trim()).filter(Boolean);
  for (const item of items) {
    const li = document.createElement("li");
    let last = 0;
    for (const match of item.matchAll(ADDRESS)) {
      li.appendChild(document.createTextNode(item.slice(last, match.index)));
      const href = /^https?:\/\//i.test(match[1]) ? match[1] : "https://" + match[1];
      let url = null;
      try { url = new URL(href); } catch (e) { url = null; }
      if (url && (url.protocol === "https:" || url.protocol === "http:")) {
        const a = document.createElement("a");
        a.href = url.href;
        a.textContent = match[1];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        li.appendChild(a);
      } else li.appendChild(document.createTextNode(match[1]));
      last = match.index + match[1].length;
    }
    li.appendChild(document.createTextNode(item.slice(last)));
    list.appendChild(li);
  }
  $("basis-details").hidden = items.length === 0;
  $("basis-count").textContent = `${items.length} item${items.length === 1 ? "" : "s"}`;
}

// Charts are slower to draw than the cards: draw them on the next frame, only for the newest result.
let chartFrame = null;
function scheduleCharts(data, mySeq, started) {
  if (chartFrame !== null) cancelAnimationFrame(chartFrame);
  chartFrame = requestAnimationFrame(() => {
    chartFrame = null;
    if (window.Plotly) { renderRoofline(data.roofline, data.estimate); renderCurve(data, data.estimate); }
    else { $("roofline-chart").textContent = "chart library unavailable (plotly is not installed)"; }
    window.speedlimit.chartSeq = mySeq;
    window.speedlimit.lastChartMs = performance.now() - started;
  });
}

function renderMemory(e) {
  const capacity = e.memory_capacity_bytes;
  const used = e.memory_bytes;  // every replica's weights and every sequence's KV, on all the devices
  const weights = used - e.kv_cache_bytes;
  const total = capacity ? Math.max(capacity, used) : used;
  const pct = (x) => (100 * x / total).toFixed(2) + "%";
  const bar = $("memory-bar");
  const over = capacity !== null && (used > capacity || e.fits === false);  // the fullest device decides
  bar.classList.toggle("over", over);
  $("mem-weights").style.width = pct(over ? Math.min(weights, capacity) : weights);
  $("mem-kv").style.width = pct(over ? Math.max(0, Math.min(e.kv_cache_bytes, capacity - weights)) : e.kv_cache_bytes);
  $("mem-free").style.width = capacity === null ? "0%" : pct(Math.abs(capacity - used));
  $("mem-weights").title = "weights " + fmtBytes(weights);
  $("mem-kv").title = "KV cache " + fmtBytes(e.kv_cache_bytes);
  let text = `weights ${fmtBytes(weights)} + KV ${fmtBytes(e.kv_cache_bytes)} (${fmtBytes(e.kv_bytes_per_token)}/token/sequence)`;
  if (capacity === null) text += " — capacity unknown";
  else {
    text += ` of ${fmtBytes(capacity)} usable` + (e.devices > 1 ? ` across ${e.devices} devices` : "");
    if (e.devices > 1) text += ` (tp ${e.tp} × pp ${e.pp} × dp ${e.dp}${e.ep > 1 ? `, ep ${e.ep}` : ""}; ${fmtBytes(e.memory_per_device_bytes)} on the fullest device)`;
    text += over ? (used > capacity ? ` — does NOT fit (over by ${fmtBytes(used - capacity)})` : " — does NOT fit on the fullest device") : ` — fits, ${fmtBytes(capacity - used)} free`;
    if (e.max_batch !== null) text += `; max batch ${fmtInt(e.max_batch)}`;
  }
  $("memory-text").textContent = text;
  bar.dataset.fits = String(e.fits);
}

const PLOT_CONFIG = { displayModeBar: false, responsive: true };
const REGIME_COLOR = { memory: "#2463eb", compute: "#dc2626" };

function renderRoofline(r, e) {
  const tera = (ys) => ys.map((y) => y / 1e12);
  const traces = [
    { x: r.intensity, y: tera(r.peak_roof_flops), mode: "lines", name: "peak roof", line: { color: "#98a2b3", dash: "dash" }, hoverinfo: "skip" },
  ];
  if (e.mode !== "ideal") traces.push({ x: r.intensity, y: tera(r.effective_roof_flops), mode: "lines", name: "achievable roof", line: { color: "#2463eb" }, hoverinfo: "skip" });
  traces.push({
    x: [r.point.intensity], y: [r.point.flops / 1e12], mode: "markers", name: `this config (${r.point.regime}-bound)`,
    marker: { size: 13, color: REGIME_COLOR[r.point.regime] || "#f59e0b", line: { color: "#111", width: 1 } },
    hovertemplate: "AI %{x:.3g} FLOP/B<br>%{y:.3g} TFLOP/s achieved<extra></extra>",
  });
  const shapes = [];
  if (r.ridge_intensity) shapes.push({ type: "line", xref: "x", yref: "paper", x0: r.ridge_intensity, x1: r.ridge_intensity, y0: 0, y1: 1, line: { color: "#98a2b3", dash: "dot", width: 1 } });
  const layout = {
    title: { text: `Roofline — ${r.point.regime}-bound at ${fmtNum(r.point.intensity)} FLOP/byte`, font: { size: 14 } },
    xaxis: { type: "log", title: { text: "arithmetic intensity (FLOP per byte)" }, dtick: 1 },
    yaxis: { type: "log", title: { text: "TFLOP/s per device" }, dtick: 1 },
    margin: { l: 60, r: 10, t: 36, b: 44 }, legend: { x: 0.02, y: 0.98, bgcolor: "rgba(255,255,255,.7)" }, shapes,
    annotations: r.ridge_intensity ? [{ x: Math.log10(r.ridge_intensity), y: 0.02, xref: "x", yref: "paper", text: `ridge ${fmtNum(r.ridge_intensity)}`, showarrow: false, font: { size: 10, color: "#667085" }, xanchor: "left" }] : [],
  };
  Plotly.react("roofline-chart", traces, layout, PLOT_CONFIG);
}

function renderCurve(data, e) {
  const pts = data.points;
  const fit = pts.filter((p) => p.fits !== false);
  const nofit = pts.filter((p) => p.fits === false);
  const hover = "batch %{text}<br>%{x:.3s} tok/s per user<br>%{y:.3s} tok/s total<extra></extra>";
  const traces = [
    { x: fit.map((p) => p.decode_tok_s), y: fit.map((p) => p.throughput_tok_s), text: fit.map((p) => p.batch), mode: "lines+markers", name: "fits in memory", line: { color: "#2463eb" }, hovertemplate: hover },
  ];
  if (nofit.length) traces.push({ x: nofit.map((p) => p.decode_tok_s), y: nofit.map((p) => p.throughput_tok_s), text: nofit.map((p) => p.batch), mode: "markers", name: "does not fit", marker: { color: "#98a2b3", symbol: "x" }, hovertemplate: hover });
  traces.push({ x: [e.decode_tok_s], y: [e.throughput_tok_s], text: [e.batch], mode: "markers", name: `batch ${e.batch}`, marker: { size: 13, color: "#f59e0b", line: { color: "#111", width: 1 } }, hovertemplate: hover });
  const annotations = [];
  const knee = pts.find((p) => p.batch === data.knee_batch);
  if (knee) {
    traces.push({ x: [knee.decode_tok_s], y: [knee.throughput_tok_s], text: [knee.batch], mode: "markers", name: `knee (batch ${knee.batch})`, marker: { size: 14, color: "#dc2626", symbol: "diamond" }, hovertemplate: hover });
    annotations.push({ x: Math.log10(knee.decode_tok_s), y: Math.log10(knee.throughput_tok_s), text: `knee: batch ${knee.batch}`, showarrow: true, arrowhead: 2, ax: -50, ay: 40, font: { size: 11, color: "#dc2626" } });
  }
  const layout = {
    title: { text: "Throughput vs per-user speed across batch sizes", font: { size: 14 } },
    xaxis: { type: "log", title: { text: "decode tok/s per user" }, exponentformat: "SI" },
    yaxis: { type: "log", title: { text: "aggregate tok/s" }, exponentformat: "SI" },
    margin: { l: 60, r: 10, t: 36, b: 44 }, legend: { x: 0.02, y: 0.02, yanchor: "bottom", bgcolor: "rgba(255,255,255,.7)" }, annotations,
  };
  Plotly.react("curve-chart", traces, layout, PLOT_CONFIG);
}

// ---------------------------------------------------------------- serving view (POST /api/simulate)
// A simulation takes up to about a second: wait for the controls to settle, and let only the newest answer draw.
const SIM_DEBOUNCE_MS = 350;
let simSeq = 0;
let simTimer = null;
let simController = null;

function simRequestBody() {
  const body = requestBody(readState());
  const sim = readSimState();
  body.load = sim.sim_load;
  if (sim.sim_values) {
    const values = sim.sim_values.split(",").map((v) => v.trim()).filter((v) => v !== "");
    const numbers = values.map(Number);
    const bad = values.find((v, i) => !isFinite(numbers[i]));
    if (bad !== undefined) throw new Error(`levels: "${bad}" is not a number (give numbers separated by commas)`);
    body.values = numbers;
  }
  if (sim.sim_engine) body.scheduler = sim.sim_engine;
  if (sim.sim_max_seqs) body.max_seqs = Number(sim.sim_max_seqs);
  const slo = [];
  if (sim.slo_ttft) slo.push(`ttft=${sim.slo_ttft}ms`);
  if (sim.slo_tpot) slo.push(`tpot=${sim.slo_tpot}ms`);
  if (slo.length) body.slo = slo.join(",");
  return body;
}

function scheduleServing() {
  window.speedlimit.simPending = true;
  clearTimeout(simTimer);
  simTimer = setTimeout(updateServing, SIM_DEBOUNCE_MS);
}

function showSimError(message) {
  const box = $("sim-error");
  box.hidden = !message;
  box.textContent = message || "";
  $("sim-cards").classList.toggle("stale", !!message);
  $("serving-chart").classList.toggle("stale", !!message);
  if (message) window.speedlimit.simErrors += 1;
}

async function updateServing() {
  const mySeq = ++simSeq;
  let body;
  try { body = simRequestBody(); } catch (e) { showSimError(e.message); window.speedlimit.simPending = false; return; }
  if (simController) simController.abort();
  simController = new AbortController();
  try {
    const response = await fetch("/api/simulate", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal: simController.signal,
    });
    const data = await response.json();
    if (mySeq !== simSeq) return;
    if (!response.ok) { showSimError(data.detail || ("HTTP " + response.status)); return; }
    showSimError(null);
    renderServing(data);
  } catch (e) {
    if (e.name === "AbortError") return;
    if (mySeq === simSeq) showSimError("simulation failed: " + e.message);
  } finally {
    if (mySeq === simSeq) window.speedlimit.simPending = false;
  }
}

function fmtLoad(parameter, value) {
  if (value === null || value === undefined) return "–";
  return parameter === "rate" ? `${fmtNum(value)} req/s` : `${fmtInt(value)} clients`;
}

function setValue(id, text, value) {
  $(id).textContent = text;
  $(id).dataset.value = value === null || value === undefined ? "" : String(value);
}

function renderServing(d) {
  const p = d.parameter;
  setValue("sim-knee", fmtLoad(p, d.knee_load), d.knee_load);
  $("sim-knee-sub").textContent = `${fmtNum(d.knee_output_tok_s)} tok/s, ${Math.round(100 * d.knee_fraction)}% of the best level; more load adds latency`;
  setValue("sim-saturation", fmtNum(d.saturation_output_tok_s), d.saturation_output_tok_s);
  $("sim-saturation-sub").textContent = d.saturation_request_s !== null
    ? `the engine saturates at ${fmtNum(d.saturation_request_s)} req/s (${fmtNum(d.saturation_rate_output_tok_s)} tok/s)`
    : `best level: ${fmtLoad(p, d.saturation_load)}`;
  const sloKeys = Object.keys(d.slo || {});
  if (!sloKeys.length) { setValue("sim-slo-max", "–", null); $("sim-slo-sub").textContent = "set a TTFT or TPOT bound"; }
  else {
    setValue("sim-slo-max", d.slo_max_load === null ? "none of these" : fmtLoad(p, d.slo_max_load), d.slo_max_load);
    $("sim-slo-sub").textContent = "≥ 99% of requests within " + sloKeys.map((k) => `${k.toUpperCase()} ${fmtSeconds(d.slo[k])}`).join(", ");
  }
  const notes = $("sim-notes");
  notes.replaceChildren();
  for (const note of d.notes) { const li = document.createElement("li"); li.textContent = note; notes.appendChild(li); }
  $("sim-command").textContent = d.command;
  const e = d.engine || {};
  $("sim-caption").textContent = `Predicted TTFT and TPOT (p50, p99) and output throughput against ${p === "rate" ? "the arrival rate" : "concurrency"}: `
    + `${d.requests_per_level} requests per level, prompt ${fmtInt(d.prompt)} and output ${fmtInt(d.output)} tokens; ${e.model} on ${e.hardware}, `
    + `${e.engine ? e.engine + " engine profile, " : ""}${e.mode} scheduling, up to ${fmtInt(e.max_seqs)} sequences and ${fmtInt(e.max_batched_tokens)} tokens per step`
    + (e.kv_capacity_tokens ? `, KV cache ${fmtInt(e.kv_capacity_tokens)} tokens.` : ".");
  if (window.Plotly) renderServingChart(d);
  else $("serving-chart").textContent = "chart library unavailable (plotly is not installed)";
  window.speedlimit.simLast = d;
  window.speedlimit.simRenders += 1;
}

function renderServingChart(d) {
  const x = d.points.map((q) => q.load);
  const ms = (key) => d.points.map((q) => (q[key] === null ? null : q[key] * 1e3));
  const lat = (key, name, color, dash) => ({ x, y: ms(key), name, mode: "lines+markers", line: { color, dash }, hovertemplate: `${name} %{y:.4g} ms at %{x}<extra></extra>` });
  const traces = [
    lat("ttft_p50_s", "TTFT p50", "#2463eb", "solid"), lat("ttft_p99_s", "TTFT p99", "#2463eb", "dash"),
    lat("tpot_p50_s", "TPOT p50", "#f59e0b", "solid"), lat("tpot_p99_s", "TPOT p99", "#f59e0b", "dash"),
    { x, y: d.points.map((q) => q.output_tok_s), name: "output tok/s", yaxis: "y2", mode: "lines+markers", line: { color: "#16a34a", width: 3 }, hovertemplate: "%{y:.4s} tok/s at %{x}<extra></extra>" },
  ];
  const shapes = [];
  const annotations = [];
  // vertical markers, labelled at the top: the knee's label left of its line, the saturation rate's right of its own
  const vline = (at, color, text, side) => {
    shapes.push({ type: "line", xref: "x", yref: "paper", x0: at, x1: at, y0: 0, y1: 1, line: { color, dash: "dot", width: 2 } });
    annotations.push({ x: d.parameter === "rate" ? at : Math.log10(at), y: 1, xref: "x", yref: "paper", text, showarrow: false, yanchor: "bottom", xanchor: side, font: { size: 11, color } });
  };
  if (d.knee_load !== null) vline(d.knee_load, "#dc2626", `knee ${fmtNum(d.knee_load)} `, "right");
  if (d.saturation_request_s !== null) vline(d.saturation_request_s, "#7c3aed", ` saturation ${fmtNum(d.saturation_request_s)} req/s`, "left");
  for (const [key, bound] of Object.entries(d.slo || {})) {
    if (key === "ttft" || key === "tpot") shapes.push({ type: "line", xref: "paper", yref: "y", x0: 0, x1: 1, y0: bound * 1e3, y1: bound * 1e3, line: { color: key === "ttft" ? "#2463eb" : "#f59e0b", dash: "dashdot", width: 1 } });
  }
  const layout = {
    title: { text: `Predicted latency and throughput vs ${d.parameter}`, font: { size: 14 }, y: 0.97 },
    xaxis: { type: d.parameter === "rate" ? "linear" : "log", title: { text: d.parameter === "rate" ? "arrival rate (requests/s)" : "concurrency (clients in flight)" } },
    yaxis: { type: "log", title: { text: "latency (ms)" }, exponentformat: "SI" },
    yaxis2: { overlaying: "y", side: "right", title: { text: "output tok/s" }, rangemode: "tozero", exponentformat: "SI", showgrid: false, tickmode: "auto", nticks: 6 },
    margin: { l: 60, r: 60, t: 52, b: 80 }, legend: { orientation: "h", y: -0.32 }, shapes, annotations,
  };
  Plotly.react("serving-chart", traces, layout, PLOT_CONFIG);
}

// ---------------------------------------------------------------- startup
function fillSelect(select, items) {
  select.innerHTML = "";
  for (const item of items) {
    const option = document.createElement("option");
    option.value = item.name;
    option.textContent = item.label && item.label !== item.name ? `${item.name} — ${item.label}` : item.name;
    select.appendChild(option);
  }
}

// The engine profiles after the "" option (unset: the API's default, named after the profile marked default).
function fillEngines(engines) {
  const select = $("engine");
  select.replaceChildren();
  const fallback = engines.find((e) => e.default);
  const unset = document.createElement("option");
  unset.value = "";
  unset.textContent = fallback ? `default (${fallback.label})` : "default";
  select.appendChild(unset);
  for (const item of engines) {
    const option = document.createElement("option");
    option.value = item.name;
    option.textContent = item.label && item.label !== item.name ? `${item.name} — ${item.label}` : item.name;
    select.appendChild(option);
  }
}

async function init() {
  const ticks = $("weights-tick-labels");
  BITS.forEach((b) => { const s = document.createElement("span"); s.textContent = b; ticks.appendChild(s); });
  const [models, hardware, engines] = await Promise.all(["/api/models", "/api/hardware", "/api/engines"].map((path) => fetch(path).then((r) => r.json())));
  modelAliases = new Map();
  for (const m of models) {
    modelAliases.set(normalize(m.name), m.name);
    for (const alias of m.aliases || []) if (!modelAliases.has(normalize(alias))) modelAliases.set(normalize(alias), m.name);
  }
  fillSelect($("model"), models);
  fillSelect($("hardware"), hardware);
  fillEngines(engines);
  writeState(stateFromUrl());
  writeSimState(simStateFromUrl());
  $("controls").addEventListener("input", (event) => {
    const id = event.target.id;
    if (id === "batch-range") $("batch").value = batchFromRange();
    if (id === "batch") $("batch-range").value = Math.log2(Math.max(1, parseInt($("batch").value, 10) || 1));
    if (id === "weights-bits") $("weights-format").value = "";
    scheduleUpdate();
  });
  $("controls").addEventListener("change", scheduleUpdate);
  $("config-clear").addEventListener("click", () => { $("config").value = ""; scheduleUpdate(); });
  const serving = () => { stateToUrl(readState()); scheduleServing(); };
  $("serving").addEventListener("input", serving);
  $("serving").addEventListener("change", serving);
  scheduleServing();
  await update();
}

document.addEventListener("DOMContentLoaded", () => { init().catch((e) => showError("could not start: " + e.message)); });
