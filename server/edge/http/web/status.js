// The status page: GET /v1/status every few seconds (server/http/status.py). Its counters are cumulative,
// so the page plots differences between samples: tokens/s, and latency percentiles of the texts that
// finished in each interval, read from the histogram's buckets as Prometheus's histogram_quantile reads them.
import { callJson, wireKeyForm } from "./api.js";

const $ = (id) => document.getElementById(id);
const asked = new URLSearchParams(location.search);
const EVERY_S = Math.max(0.25, Number(asked.get("every")) || 2);
const WINDOW_S = 300;
const SPANS = [30, 60, 120, 180, 240, WINDOW_S]; // seconds the plot's time axis shows
const TICKS = [5, 10, 15, 30, 60, 120, 300];
const samples = []; // {t, tokens, latency: {bounds, counts, count}, firstToken: {...}}
const points = []; // {t, rate, p50, p95, first}
let timer = null;
const keyForm = wireKeyForm(() => poll());

$("every").textContent = String(EVERY_S);
$("window").textContent = String(WINDOW_S / 60);

function summed(models, field) {
  const out = { bounds: [], counts: [], count: 0 };
  for (const model of models) {
    const h = model[field];
    if (!h || !h.bounds.length) continue;
    if (!out.bounds.length) {
      out.bounds = h.bounds.slice();
      out.counts = h.counts.map(() => 0);
    }
    if (h.bounds.length !== out.bounds.length) continue; // one declaration serves every model
    h.counts.forEach((c, i) => { out.counts[i] += c; });
    out.count += h.count;
  }
  return out;
}

// The q-quantile of the observations between two cumulative snapshots of one histogram, in seconds.
export function quantile(q, before, after) {
  const total = after.count - (before ? before.count : 0);
  if (!(total > 0) || !after.bounds.length) return null;
  const counts = after.counts.map((c, i) => c - (before && before.counts.length ? before.counts[i] : 0));
  const rank = q * total;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] >= rank) {
      const lower = i === 0 ? 0 : after.bounds[i - 1];
      const below = i === 0 ? 0 : counts[i - 1];
      const inside = counts[i] - below;
      return inside > 0 ? lower + (after.bounds[i] - lower) * ((rank - below) / inside) : after.bounds[i];
    }
  }
  return after.bounds[after.bounds.length - 1]; // beyond the largest bucket: its bound, as Prometheus says
}

const ms = (s) => (s === null ? "\u2013" : s < 1 ? `${Math.round(s * 1000)} ms` : `${s.toFixed(2)} s`);

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
}

function showTables(status) {
  $("models").replaceChildren(...status.models.map((m) => {
    const row = document.createElement("tr");
    cell(row, `${m.name} v${m.version}`);
    cell(row, m.pairs.join(", "));
    cell(row, m.variant);
    cell(row, m.provider);
    cell(row, String(m.running));
    cell(row, String(m.waiting));
    cell(row, String(m.texts));
    cell(row, String(m.outputTokens));
    return row;
  }));
  $("replicas").replaceChildren(...status.replicas.map((r) => {
    const row = document.createElement("tr");
    cell(row, r.name);
    cell(row, r.up ? "up" : "down", r.up ? "up" : "down");
    cell(row, r.pid ? `pid ${r.pid}` : "");
    return row;
  }));
  const mb = (bytes) => `${(bytes / 1048576).toFixed(0)} MB`;
  $("memory").replaceChildren(...(status.memory || []).map((p) => {
    const row = document.createElement("tr");
    cell(row, p.role === "frontend" ? `frontend ${p.name}` : p.role === "replica" ? `replica ${p.name}` : p.name);
    cell(row, String(p.pid));
    cell(row, mb(p.rssBytes));
    return row;
  }));
  $("memory-total").textContent = mb(status.memoryTotalBytes || 0);
  $("engine").textContent = status.engine === "process"
    ? "The engine runs in core processes of its own (--engine-core process)."
    : "The engine runs in the server's own process (--engine-core thread).";
  const healthy = status.health.live === "SERVING" && status.health.ready === "SERVING";
  $("health").textContent = healthy ? "serving" : `live ${status.health.live}, ready ${status.health.ready}`;
  $("health").className = healthy ? "up" : "down";
}

function record(status) {
  const sample = {
    t: status.time,
    tokens: status.models.reduce((n, m) => n + m.outputTokens, 0),
    latency: summed(status.models, "latency"),
    firstToken: summed(status.models, "firstToken"),
  };
  const before = samples[samples.length - 1];
  samples.push(sample);
  if (before && sample.t > before.t) {
    points.push({
      t: sample.t,
      rate: Math.max(0, (sample.tokens - before.tokens) / (sample.t - before.t)),
      p50: quantile(0.5, before.latency, sample.latency),
      p95: quantile(0.95, before.latency, sample.latency),
      first: quantile(0.5, before.firstToken, sample.firstToken),
    });
  }
  while (samples.length > 2 && samples[0].t < sample.t - WINDOW_S) samples.shift();
  while (points.length && points[0].t < sample.t - WINDOW_S) points.shift();
  const running = status.models.reduce((n, m) => n + m.running, 0);
  const waiting = status.models.reduce((n, m) => n + m.waiting, 0);
  $("queue").textContent = `${running} / ${waiting}`;
  const last = points[points.length - 1];
  if (last) {
    $("tokens-rate").textContent = last.rate.toFixed(last.rate < 10 ? 1 : 0);
    $("latency").textContent = `${ms(last.p50)} / ${ms(last.p95)}`;
    $("first-token").textContent = ms(last.first);
  }
}

// The axis's top: the value rounded up to 1, 2, 2.5, 4, 5 or 8 times a power of ten (quarters read well).
function nice(value) {
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  return [1, 2, 2.5, 4, 5, 8, 10].find((m) => m * power >= value) * power;
}

function colour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

function draw() {
  const canvas = $("plot");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight;
  canvas.width = Math.round(width * ratio);
  canvas.height = Math.round(height * ratio);
  const g = canvas.getContext("2d");
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const left = 56, right = 64, top = 24, bottom = 26;
  const w = Math.max(10, width - left - right), h = Math.max(10, height - top - bottom);
  const now = points.length ? points[points.length - 1].t : Date.now() / 1000;
  // the time axis grows with the samples, from 30 s up to the whole window, so a new page is not empty
  const span = SPANS.find((s) => s >= (points.length ? now - points[0].t : 0)) || WINDOW_S;
  const x = (t) => left + w * (1 - (now - t) / span);
  const maxRate = nice(Math.max(1, ...points.map((p) => p.rate)) * 1.1);
  const maxLatency = nice(Math.max(0.01, ...points.map((p) => p.p50 || 0)) * 1.1);
  const text = colour("--muted"), line = colour("--line");
  g.font = "12px system-ui, sans-serif";
  g.lineWidth = 1;
  g.strokeStyle = line;
  g.fillStyle = text;
  for (let i = 0; i <= 4; i++) {
    const y = top + (h * i) / 4;
    g.beginPath();
    g.moveTo(left, y);
    g.lineTo(left + w, y);
    g.stroke();
    g.textAlign = "right";
    const rate = (maxRate * (4 - i)) / 4;
    g.fillText(rate === 0 ? "0" : rate < 10 ? rate.toFixed(1) : String(Math.round(rate)), left - 6, y + 4);
    g.textAlign = "left";
    g.fillText(ms((maxLatency * (4 - i)) / 4), left + w + 6, y + 4);
  }
  g.textAlign = "center";
  const tick = TICKS.find((t) => (w * t) / span >= 60) || span; // seconds between labels, >= 60 px apart
  for (let ago = 0; ago <= span; ago += tick) {
    const label = ago === 0 ? "now" : ago % 60 === 0 ? `-${ago / 60} min` : `-${ago} s`;
    g.fillText(label, x(now - ago), top + h + 18);
  }
  const series = (key, scale, colourName, dash) => {
    g.strokeStyle = colour(colourName);
    g.lineWidth = 2;
    g.setLineDash(dash);
    g.beginPath();
    let drawing = false;
    for (const p of points) {
      if (p[key] === null) { drawing = false; continue; }
      const px = x(p.t), py = top + h * (1 - p[key] / scale);
      if (drawing) g.lineTo(px, py);
      else g.moveTo(px, py);
      drawing = true;
    }
    g.stroke();
    g.setLineDash([]);
  };
  series("rate", maxRate, "--plot-a", []);
  series("p50", maxLatency, "--plot-b", [6, 4]);
  g.textAlign = "left";
  g.fillStyle = colour("--plot-a");
  g.fillText("tokens/s", left, 14);
  g.fillStyle = colour("--plot-b");
  g.textAlign = "right";
  g.fillText("latency p50", left + w, 14);
  canvas.dataset.points = String(points.length);
  const last = points[points.length - 1];
  canvas.dataset.lastRate = last ? last.rate.toFixed(2) : "";
  canvas.dataset.peakRate = points.length ? Math.max(...points.map((p) => p.rate)).toFixed(2) : "";
  canvas.setAttribute("aria-label", last
    ? `Last ${points.length} samples: now ${last.rate.toFixed(1)} tokens per second, median latency ${ms(last.p50)}`
    : "No samples yet");
}

async function poll() {
  clearTimeout(timer);
  try {
    const status = await callJson("/v1/status");
    $("status-error").textContent = "";
    showTables(status);
    record(status);
    draw();
  } catch (error) {
    $("status-error").textContent = error.message;
    if (error.auth) {
      keyForm.ask(error.message);
      return; // until a key is given
    }
  }
  timer = setTimeout(poll, EVERY_S * 1000);
}

window.addEventListener("resize", draw);
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);
poll();
