// The run report (`alpha-native report`): a training run's metrics (and optionally its trace)
// as charts and tables. `alpha-native report` inlines this file and www/charts.js into one
// HTML file with the data, which opens from disk with no network.
//
// render(root, data) draws `data`: { runs: [{ name, skipped, records }], trace: { steps,
// step_ms, ops: [{ name, track, pass, count, total_ms, share }], kernels_per_step,
// device_busy_ms, wall_ms } | null }, where `records` are a run's metrics records. Served by
// `train --serve`, the page polls the run's records instead and draws them as they come.

import { PALETTE, lineChart, stackedBars } from "./charts.js";

const PHASES = ["data", "forward", "backward", "allreduce", "grad_norm", "optimizer", "eval", "sample", "checkpoint", "submit", "device_wait", "idle"];

const el = (tag, attrs = {}, children = []) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of [].concat(children)) e.append(c);
  return e;
};
const num = (v, digits = 4) => (typeof v === "number" && Number.isFinite(v) ? (Math.abs(v) >= 1e4 ? v.toFixed(0) : v.toPrecision(digits)) : "–");
const median = (xs) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length ? (s[(s.length - 1) >> 1] + s[s.length >> 1]) / 2 : NaN;
};

/** A canvas for a chart, with its caption. */
function chartBox(root, id, caption) {
  const canvas = el("canvas", { id, width: "720", height: "260", "aria-label": caption });
  root.append(el("figure", {}, [canvas, el("figcaption", {}, caption)]));
  return canvas;
}

function header(root, runs) {
  const rows = [
    ["model", (r) => r.start.config ? `${r.start.config.n_layer}L/${r.start.config.n_head}H/${r.start.config.n_embd}E, block ${r.start.config.block_size}, vocab ${r.start.config.vocab_size}` : "–"],
    ["parameters", (r) => num(r.start.params, 6)],
    ["batch", (r) => r.start.settings ? `${r.start.settings.batch} x ${r.start.settings.grad_accum} x ${r.start.ranks ?? 1} rank(s)` : "–"],
    ["backend", (r) => [r.start.backend, r.start.device?.adapter].filter(Boolean).join(": ") || "–"],
    ["precision", (r) => r.start.precision ?? "–"],
    ["machine", (r) => (r.start.machine ? `${r.start.machine.cpu}, ${r.start.machine.threads} threads, ${r.start.machine.gemm_kernel}` : "–")],
    ["memory plan (MiB)", (r) => (r.start.memory_mib ? `${num(r.start.memory_mib.total)} (activations ${num(r.start.memory_mib.activations)})` : "–")],
    ["steps", (r) => String((r.train.at(-1)?.step ?? -1) + 1)],
    ["last train loss", (r) => num(r.train.at(-1)?.loss)],
    ["last val loss", (r) => num(r.eval.at(-1)?.val_loss)],
    ["tokens/s (median)", (r) => num(median(r.train.map((t) => t.tokens_per_sec)), 5)],
    ["MFU (median)", (r) => { const m = median(r.train.map((t) => t.mfu)); return Number.isFinite(m) ? `${(100 * m).toFixed(1)}%` : "–"; }],
    ["loss scale (last)", (r) => num(r.train.at(-1)?.loss_scale)],
    ["steps skipped (f16 overflow)", (r) => (r.train.some((t) => t.skipped_steps != null) ? String(r.train.reduce((n, t) => n + (t.skipped_steps ?? 0), 0)) : "–")],
    ["skipped lines", (r) => String(r.skipped)],
  ];
  const table = el("table", { id: "summary" }, [el("tr", {}, [el("th", {}, "run"), ...runs.map((r) => el("th", {}, r.name))])]);
  for (const [name, f] of rows) table.append(el("tr", {}, [el("td", {}, name), ...runs.map((r) => el("td", {}, f(r)))]));
  root.append(el("h2", {}, "Runs"), table);
}

function series(runs, pick, x = (r) => r.step) {
  return runs.map((run) => ({ name: run.name, points: run.train.map((r) => [x(r), pick(r)]) }));
}

/** Draws every chart of the report; `logY` puts the losses on a log scale. */
function charts(root, runs, logY) {
  root.replaceChildren();
  const losses = (x) =>
    runs.flatMap((run) => [
      { name: `${run.name} train`, points: run.train.map((r) => [x(r), r.loss]) },
      { name: `${run.name} val`, points: run.eval.map((r) => [x(r), r.val_loss]), dots: true },
    ]);
  lineChart(chartBox(root, "chart-loss-step", "train and val loss against step"), { series: losses((r) => r.step), xLabel: "step", yLabel: "loss", logY });
  lineChart(chartBox(root, "chart-loss-time", "train and val loss against wall time (s)"), { series: losses((r) => r.time_s), xLabel: "seconds", yLabel: "loss", logY });
  lineChart(chartBox(root, "chart-lr", "learning rate"), { series: series(runs, (r) => r.lr), xLabel: "step", yLabel: "lr" });
  // The clip threshold as a line of its own: norms above it were scaled down to it.
  const clips = runs.filter((run) => run.start.settings?.grad_clip > 0 && run.train.length).map((run) => ({
    name: `${run.name} clip`,
    points: [[run.train[0].step, run.start.settings.grad_clip], [run.train.at(-1).step, run.start.settings.grad_clip]],
  }));
  lineChart(chartBox(root, "chart-grad-norm", "gradient norm before clipping, and the clip threshold"), {
    series: [...series(runs, (r) => r.grad_norm), ...clips],
    xLabel: "step",
    yLabel: "norm",
  });
  lineChart(chartBox(root, "chart-tokens", "tokens per second (whole workflow: evaluation, samples and checkpoints included)"), { series: series(runs, (r) => r.tokens_per_sec), xLabel: "step", yLabel: "tok/s" });
  lineChart(chartBox(root, "chart-mfu", "MFU and HFU (%) against the device's peak"), {
    series: runs.flatMap((run) => [
      { name: `${run.name} MFU`, points: run.train.map((r) => [r.step, 100 * r.mfu]) },
      { name: `${run.name} HFU`, points: run.train.map((r) => [r.step, 100 * r.hfu]) },
    ]),
    xLabel: "step",
    yLabel: "%",
  });
  // f16 mixed precision: the loss scale and the steps an overflow skipped (a running count).
  // Each run keeps its colour from the other charts.
  const scaled = runs.map((run, i) => ({ run, color: PALETTE[i % PALETTE.length] })).filter(({ run }) => run.train.some((r) => r.loss_scale != null));
  if (scaled.length) {
    lineChart(chartBox(root, "chart-loss-scale", "loss scale (f16 mixed precision; halved at each overflow)"), {
      series: scaled.map(({ run, color }) => ({ name: run.name, color, points: run.train.map((r) => [r.step, r.loss_scale]) })),
      xLabel: "step",
      yLabel: "scale",
      logY: true,
    });
    const skipped = scaled.map(({ run, color }) => {
      let total = 0;
      return { name: run.name, color, points: run.train.map((r) => [r.step, (total += r.skipped_steps ?? 0)]) };
    });
    lineChart(chartBox(root, "chart-skipped", "steps skipped by an f16 overflow, in total"), { series: skipped, xLabel: "step", yLabel: "steps" });
  }
  const bars = runs.map((run) => ({
    label: run.name,
    parts: PHASES.map((p) => ({ name: p, value: run.train.length ? run.train.reduce((t, r) => t + (r.ms?.[p] ?? 0), 0) / run.train.length : 0 })),
  }));
  const phases = chartBox(root, "chart-phases", "where a step's time goes: mean ms per step by phase");
  phases.height = 90 + 34 * runs.length;
  stackedBars(phases, { bars, unit: "ms" });
}

function trace(root, t) {
  root.append(el("h2", {}, "Trace"));
  const busy = t.device_busy_ms > 0 ? `; device busy ${num(t.device_busy_ms)} ms of ${num(t.wall_ms)} ms wall (${((100 * t.device_busy_ms) / t.wall_ms).toFixed(1)}%, idle ${(100 - (100 * t.device_busy_ms) / t.wall_ms).toFixed(1)}%)` : "";
  root.append(el("p", { id: "trace-summary" }, `${t.steps} traced steps, ${num(t.step_ms)} ms each; ${num(t.kernels_per_step, 4)} kernels or ops per step${busy}`));
  const head = ["op or kernel", "track", "pass", "count", "total ms", "share", "mean µs", "GFLOP/s", "GB/s"];
  const table = el("table", { id: "top-ops" }, [el("tr", {}, head.map((h) => el("th", {}, h)))]);
  for (const o of t.ops) {
    const row = [o.name, o.track, o.pass ?? "", String(o.count), num(o.total_ms), `${(100 * o.share).toFixed(1)}%`, num((1e3 * o.total_ms) / o.count), num(o.gflops), num(o.gbs)];
    table.append(el("tr", {}, row.map((c) => el("td", {}, c))));
  }
  root.append(el("p", {}, "GFLOP/s and GB/s are the ops' estimated work (products 2 FLOPs per multiply-add; tensors read and written once) over their measured time."));
  root.append(table);
}

function samples(root, runs) {
  root.append(el("h2", {}, "Samples"));
  for (const run of runs) {
    for (const s of run.samples) root.append(el("details", { class: "sample" }, [el("summary", {}, `${run.name}, step ${s.step}`), el("pre", {}, s.text)]));
  }
}

/** A run's records grouped by type: { name, skipped, start, train, eval, samples }; with
 * several start records (a resumed run appends), the first describes the run. */
export function runFromRecords(name, records, skipped = 0) {
  const of = (type) => records.filter((r) => r.type === type);
  return { name, skipped, start: of("start")[0] ?? {}, train: of("train"), eval: of("eval"), samples: of("sample") };
}

/** Losses on a log scale (kept across a live page's redraws). */
let logY = false;

/** Draws `data` into `root` (see the top of this file). */
export function render(root, data) {
  const runs = data.runs.map((r) => runFromRecords(r.name, r.records, r.skipped));
  root.replaceChildren(el("h1", {}, `Alpha run report: ${runs.map((r) => r.name).join(", ")}`));
  header(root, runs);
  const log = el("input", { type: "checkbox", id: "log-scale" });
  log.checked = logY;
  root.append(el("h2", {}, "Charts"), el("label", {}, [log, " losses on a log scale"]));
  const box = el("div", { id: "charts" });
  root.append(box);
  charts(box, runs, logY);
  log.addEventListener("change", () => {
    logY = log.checked;
    charts(box, runs, logY);
  });
  if (data.trace) trace(root, data.trace);
  samples(root, runs);
}

/** Follows a live run: polls `url` every second for its records (the server keeps a bounded
 * set, sent whole when it changed since the version the page has, else 204) and redraws when
 * they changed; `root.dataset.steps` is the steps drawn (for tests). */
async function follow(root, url) {
  let version = null;
  for (;;) {
    try {
      const response = await fetch(version === null ? url : `${url}?since=${version}`);
      if (response.status === 200) {
        const records = (await response.text()).split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));
        version = response.headers.get("X-Records-Version");
        render(root, { runs: [{ name: "live", skipped: 0, records }], trace: null });
        root.dataset.steps = String(records.filter((r) => r.type === "train").at(-1)?.step ?? -1);
      }
    } catch {
      // The run has ended (its server with it): what came stays drawn.
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

const root = document.getElementById("report");
const embedded = document.getElementById("report-data");
if (embedded) render(root, JSON.parse(embedded.textContent));
else if (root?.dataset.live) follow(root, root.dataset.live);
