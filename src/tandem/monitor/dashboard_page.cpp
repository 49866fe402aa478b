// The live dashboard's page: one HTML document with its script, served by WebServer at "/".
// Chart.js comes from the same server (/chart.js, Debian's libjs-chart.js): no CDN, no network.
// The page polls /api/series for the rows and samples it has not seen, and keeps every chart's
// points (thinned past kMaxPoints). For headless tests it writes what it holds into <body>'s data
// attributes: data-polls, data-points, data-errors and data-chartjs.

#include "tandem/monitor/web_server.h"

namespace tandem {

const std::string& dashboard_page() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tandem dashboard</title>
<style>
  :root { --fg:#1d2330; --muted:#5d6678; --bg:#f4f6fa; --card:#fff; --line:#dde2ea; --ok:#1f8a4c; --warn:#b25d00; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:var(--fg); background:var(--bg); }
  header { display:flex; align-items:baseline; gap:16px; padding:14px 22px; background:var(--card); border-bottom:1px solid var(--line); flex-wrap:wrap; }
  header h1 { font-size:18px; margin:0; }
  #info { color:var(--muted); }
  #status { margin-left:auto; padding:2px 10px; border-radius:10px; background:#e6f4ec; color:var(--ok); font-weight:600; }
  #status.done { background:#eceff4; color:var(--muted); }
  #status.lost { background:#fdf0e2; color:var(--warn); }
  #notice { display:none; margin:12px 22px 0; padding:8px 12px; background:#fdf0e2; color:var(--warn); border-radius:6px; }
  .tiles { display:grid; grid-template-columns:repeat(auto-fill, minmax(150px, 1fr)); gap:10px; padding:14px 22px 0; }
  .tile { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:8px 12px; }
  .tile .k { color:var(--muted); font-size:12px; }
  .tile .v { font-size:20px; font-weight:600; font-variant-numeric:tabular-nums; }
  .grid { display:grid; grid-template-columns:repeat(auto-fill, minmax(420px, 1fr)); gap:14px; padding:14px 22px 22px; }
  .card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:10px 12px; }
  .card h2 { font-size:14px; margin:0 0 6px; }
  .card h2 small { color:var(--muted); font-weight:normal; }
  .card .empty { color:var(--muted); font-size:12px; height:0; overflow:visible; }
  .plot { position:relative; height:230px; }
</style>
<script src="/chart.js"></script>
</head>
<body data-polls="0" data-points="0" data-errors="">
<header><h1>tandem</h1><span id="info">connecting…</span><span id="status">live</span></header>
<div id="notice"></div>
<div class="tiles" id="tiles"></div>
<div class="grid" id="grid"></div>
<script>
"use strict";
const CHARTS = /*CHARTS*/null;
const kMaxPoints = 4000;
const COLORS = ["#2f6fde", "#e0701b", "#2a9d5b", "#b03aa6", "#c7372f", "#6d5bd0", "#8a8f98"];
const errors = [];
function noteError(msg) {
  errors.push(String(msg));
  document.body.dataset.errors = errors.join(" | ");
  const n = document.getElementById("notice");
  n.style.display = "block";
  n.textContent = "error: " + errors[errors.length - 1];
}
window.addEventListener("error", (e) => noteError(e.message || e));
window.addEventListener("unhandledrejection", (e) => noteError(e.reason));

const TILES = [
  ["step", "step", (v) => v.toFixed(0)],
  ["loss", "loss", (v) => v.toFixed(4)],
  ["tokens_per_s", "tokens/s", (v) => v >= 1e4 ? (v / 1e3).toFixed(1) + " k" : v.toFixed(0)],
  ["step_time_s", "step time", (v) => v < 1 ? (v * 1e3).toFixed(1) + " ms" : v.toFixed(2) + " s"],
  ["gpu_power_w", "GPU power", (v) => v.toFixed(0) + " W"],
  ["gpu_util_pct", "GPU util", (v) => v.toFixed(0) + " %"],
  ["cpu_util_pct", "CPU util", (v) => v.toFixed(0) + " %"],
  ["energy_gpu_j_per_token", "GPU J/token", (v) => v.toPrecision(3)],
  ["offload_k", "update split k", (v) => v.toFixed(2)],
];
const tiles = {};
for (const [key, label] of TILES) {
  const d = document.createElement("div");
  d.className = "tile";
  d.innerHTML = '<div class="k"></div><div class="v">–</div>';
  d.querySelector(".k").textContent = label;
  document.getElementById("tiles").appendChild(d);
  tiles[key] = d.querySelector(".v");
}
function setTiles(obj) {
  for (const [key, , fmt] of TILES)
    if (typeof obj[key] === "number" && isFinite(obj[key])) tiles[key].textContent = fmt(obj[key]);
}

const haveChartJs = typeof Chart !== "undefined";
document.body.dataset.chartjs = haveChartJs ? "1" : "0";
if (!haveChartJs) {
  const n = document.getElementById("notice");
  n.style.display = "block";
  n.textContent = "Chart.js was not found by the server (" + (window.tandemChartJsMissing || "?") +
    "): figures only. Install Debian's libjs-chart.js or set monitor.chartjs.";
}
const charts = [];
for (const spec of CHARTS) {
  const card = document.createElement("div");
  card.className = "card";
  card.innerHTML = '<h2></h2><div class="empty">no data yet</div><div class="plot"><canvas></canvas></div>';
  card.querySelector("h2").innerHTML = spec.title + (spec.unit ? " <small>(" + spec.unit + ")</small>" : "");
  document.getElementById("grid").appendChild(card);
  const entry = { spec, card, chart: null, points: 0 };
  if (haveChartJs) {
    const datasets = spec.series.map((s, i) => {
      const stackedPart = spec.stacked && !s.overlay;
      return {
        label: s.label, data: [], borderColor: COLORS[i % COLORS.length],
        backgroundColor: COLORS[i % COLORS.length] + (stackedPart ? "99" : "33"),
        borderWidth: stackedPart ? 1 : 1.6, pointRadius: s.key === "eval_loss" ? 3 : 0, tension: 0,
        fill: stackedPart ? (i === 0 ? "origin" : "-1") : false,
        stack: stackedPart ? "phases" : "overlay" + i,
        order: stackedPart ? 1 : 0, borderDash: s.overlay ? [5, 3] : [],
      };
    });
    entry.chart = new Chart(card.querySelector("canvas"), {
      type: "line",
      data: { datasets },
      options: {
        animation: false, parsing: false, normalized: true, maintainAspectRatio: false,
        interaction: { mode: "nearest", axis: "x", intersect: false },
        plugins: { legend: { labels: { boxWidth: 12, font: { size: 11 } } } },
        scales: {
          x: { type: "linear", title: { display: true, text: spec.axis === "step" ? "step" : "seconds since start" } },
          y: { stacked: spec.stacked, beginAtZero: spec.stacked || spec.id === "split_k" },
        },
      },
    });
  }
  charts.push(entry);
}

function thin(arr) {
  if (arr.length <= kMaxPoints) return;
  const half = Math.floor(arr.length / 2);
  const kept = arr.slice(0, half).filter((_, i) => i % 2 === 0);
  arr.splice(0, half, ...kept);
}
function addPoints(items, axis) {
  for (const entry of charts) {
    if (entry.spec.axis !== axis) continue;
    entry.spec.series.forEach((s, i) => {
      for (const it of items) {
        const x = it[axis], y = it[s.key];
        if (typeof x !== "number" || typeof y !== "number" || !isFinite(y)) continue;
        if (entry.chart) {
          const data = entry.chart.data.datasets[i].data;
          data.push({ x, y: y * entry.spec.scale });
          thin(data);
        }
        entry.points++;
      }
    });
  }
}

let nextRow = 0, nextSample = 0, polls = 0, done = false;
async function poll() {
  let body;
  try {
    const r = await fetch("/api/series?row=" + nextRow + "&sample=" + nextSample, { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    body = await r.json();
  } catch (e) {
    const st = document.getElementById("status");
    st.className = "lost";
    st.textContent = done ? "finished" : "server gone";
    return;
  }
  polls++;
  const info = body.info || {};
  document.getElementById("info").textContent =
    [info.run_dir, info.model, info.device, info.precision, info.mode].filter(Boolean).join(" · ");
  const steps = body.rows.filter((r) => typeof r.loss === "number" || typeof r.eval_loss === "number");
  addPoints(steps, "step");
  addPoints(body.samples, "t_s");
  nextRow = body.next_row;
  nextSample = body.next_sample;
  const last = steps.filter((r) => typeof r.loss === "number").pop();
  if (last) setTiles(last);
  if (body.samples.length) setTiles(body.samples[body.samples.length - 1]);
  let total = 0;
  for (const entry of charts) {
    if (entry.chart) entry.chart.update("none");
    entry.card.querySelector(".empty").style.display = entry.points ? "none" : "block";
    total += entry.points;
  }
  done = body.done;
  const st = document.getElementById("status");
  st.className = done ? "done" : "";
  st.textContent = done ? "finished" : "live";
  document.body.dataset.polls = String(polls);
  document.body.dataset.points = String(total);
}
async function loop() {
  await poll();
  if (!done) setTimeout(loop, 1000);
}
loop();
</script>
</body>
</html>
)HTML";
  return page;
}

}  // namespace tandem
