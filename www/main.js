// The demo page: pick a text and a model, train it with alpha-web (WebGPU or the CPU in
// WebAssembly), watch the losses and samples, save and load checkpoints.
//
// URL parameters (for links and tests): backend=auto|webgpu|cpu, preset=<name>, steps=N (the
// run's length, as iters=N), any other option of Trainer.create by its name (evalInterval=N,
// threads=N, seed=N, ...; recompute=1), tokenizer=char|512|1024|2048 (the tokenizer select),
// autostart=1, wasm=threads|relaxed|simd128 (which build, below).
// window.alpha exposes the page's state.

import { lineChart, stackedBars } from "./charts.js";
import { forgetRun, keepRun, keptRuns } from "./runs.js";
import { zip } from "./zip.js";

const params = new URLSearchParams(location.search);

// alpha-web comes in three WebAssembly builds (scripts/build-web.sh): pkg/ with SIMD128, which
// every current browser runs; pkg-relaxed/, whose CPU kernels also use relaxed SIMD's fused
// multiply-add; and pkg-threads/, relaxed SIMD with WebAssembly threads (the CPU engine on
// every core, through Web Workers on shared memory). The page loads the threads build where it
// is cross-origin isolated (serve.mjs sends the headers) and the browser validates a module
// with f32x4.relaxed_madd (this one: () -> v128, three i8x16.splat and the madd), else the
// relaxed build where it validates it, else pkg/.
const RELAXED_SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 19, 1, 17, 0,
  65, 1, 253, 15, 65, 1, 253, 15, 65, 1, 253, 15, 253, 133, 2, 11,
]);
/** The builds, by the name the `wasm` URL parameter takes. */
export const WASM_BUILDS = { threads: "./pkg-threads/alpha_web.js", relaxed: "./pkg-relaxed/alpha_web.js", simd128: "./pkg/alpha_web.js" };
const relaxed = WebAssembly.validate(RELAXED_SIMD_PROBE);
const wasmBuild = params.get("wasm") ?? (relaxed ? (globalThis.crossOriginIsolated ? "threads" : "relaxed") : "simd128");
/** Imports the first build of `names` that loads: `{ name, module }`. */
async function importBuild(names) {
  for (const [i, name] of names.entries()) {
    try {
      return { name, module: await import(WASM_BUILDS[name] ?? WASM_BUILDS.simd128) };
    } catch (e) {
      if (i === names.length - 1) throw e;
      console.warn(`${WASM_BUILDS[name]} did not load (${e}); trying the next build`);
    }
  }
}
const fallbacks = { threads: ["threads", "relaxed", "simd128"], relaxed: ["relaxed", "simd128"] };
const loaded = await importBuild(fallbacks[wasmBuild] ?? [wasmBuild]);
const init = loaded.module.default;
/** The loaded build's Trainer (for tests and benchmarks, once the page is idle). */
export const Trainer = loaded.module.Trainer;

/**
 * Model presets, by name: the library's (alpha_core::run::PRESETS, the repository's
 * config/*.toml, the same as `alpha-native train --config NAME`), each a whole options object
 * for Trainer.create. Filled once the library is loaded.
 */
export const PRESETS = {};

/** A preset's menu entry: its name and model. */
const presetLabel = (name, o) =>
  `${name}: ${o.arch === "llama" ? `Llama, ${o.kvHeads || o.heads} key/value heads, ` : ""}${o.layers} layers, ${o.heads} heads, ${o.embd} wide, block ${o.block}, batch ${o.batch}`;

/** The options the URL sets over a preset's: `steps` (the run's length) and any option by name. */
function urlOptions(options) {
  const out = {};
  for (const [key, value] of params) {
    const name = key === "steps" ? "iters" : key;
    if (!(name in options) || name === "backend") continue;
    out[name] = typeof options[name] === "boolean" ? value === "1" || value === "true" : Number(value);
  }
  return out;
}

const $ = (id) => document.getElementById(id);

/** The page's state, for people and tests. */
const state = {
  status: "loading", // loading | idle | running | paused | done | error
  losses: [], // one per step trained in this page, from step firstStep on
  firstStep: 0, // the step the model was at when this page began training it (a loaded checkpoint's)
  evals: [], // { step, train, val }
  samples: [], // { step, text }
  records: [], // every record trainer.next() returned, in order (the run's metrics)
  saved: null, // the step of the last checkpoint the run saved
  trainMs: 0, // time spent in steps (not evaluations or samples) since the page started training
  trainedSteps: 0,
  stats: null,
  error: null,
  message: "",
  // The WebAssembly build the page loaded (threads | relaxed | simd128).
  wasmBuild: null,
  // The run as this browser keeps it (runs.js): its id and name; the runs kept, newest first.
  run: null,
  kept: [],
  // The memory the settings plan (Trainer.plan), or null where they will not run.
  memory: null,
  // The Generate panel: idle | running; the prompt and the text streamed after it.
  generation: { status: "idle", text: "" },
  // The peak MFU is taken against: { gflops, source: "measured" | "cached" }, for this trainer.
  peak: null,
};
window.alpha = state;

let trainer = null;
let preset = null;
let iters = 0;
let running = false;
// Trainer calls run one at a time (each borrows the model until its promise settles).
let queue = Promise.resolve();
const use = (f) => (queue = queue.then(() => f(trainer)));

function say(text, isError = false) {
  state.message = text;
  $("message").textContent = text;
  $("message").className = isError ? "error" : "";
}

function fail(e) {
  const text = e instanceof Error ? e.message : String(e);
  state.status = "error";
  state.error = text;
  running = false;
  say(text, true);
  updateButtons();
}

function updateButtons() {
  const generating = state.generation.status === "running";
  $("start").disabled = running || generating;
  $("start").textContent = trainer && state.status === "paused" ? "Resume" : "Start";
  $("pause").disabled = !running;
  $("download").disabled = !trainer || running || generating;
  $("export-hf").disabled = !trainer || running || generating;
  $("generate").disabled = !trainer || running || generating;
  $("stop").disabled = !generating;
  $("measure-peak").disabled = !trainer || running || generating;
}

let shakespeare = null;
async function readText() {
  switch ($("corpus").value) {
    case "shakespeare":
      if (shakespeare === null) {
        const response = await fetch("data/shakespeare.txt");
        if (!response.ok) throw new Error(`cannot load the Shakespeare corpus: HTTP ${response.status}`);
        shakespeare = await response.text();
      }
      return shakespeare;
    case "paste":
      return $("paste").value;
    default: {
      const file = $("upload").files[0];
      if (!file) throw new Error("choose a .txt file to train on");
      return await file.text();
    }
  }
}

function backendChoice() {
  const choice = $("backend").value;
  if (choice !== "cpu" && !navigator.gpu) {
    if (choice === "webgpu") throw new Error("this browser has no WebGPU; choose the CPU (WebAssembly) backend");
    say("This browser has no WebGPU: training on the CPU (WebAssembly).");
    return "cpu";
  }
  return choice;
}

// What the browser says of its WebGPU adapter (wgpu's name for it is often empty: browsers
// hide the description).
let adapterLabel = "";
async function describeAdapter() {
  const info = (await navigator.gpu?.requestAdapter())?.info;
  adapterLabel = info ? [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") : "";
}

/** Tokens per second over the steps trained so far. */
function tokensPerSec() {
  return (state.trainedSteps * state.stats.tokensPerStep) / (state.trainMs / 1e3);
}

function showStats() {
  const s = (state.stats = trainer.stats());
  $("backend-name").textContent =
    s.backend === "webgpu"
      ? `WebGPU (${s.adapter || adapterLabel || "default adapter"}), ${s.precision}${s.precisionFallback ? " (no shader-f16)" : ""}`
      : `CPU (WebAssembly, ${s.kernel === "wasm-relaxed-simd" ? "relaxed SIMD" : "SIMD128"}, ${s.threads} thread${s.threads === 1 ? "" : "s"})`;
  $("step").textContent = String(s.step);
  if (state.trainMs > 0) $("tok-s").textContent = Math.round(tokensPerSec()).toLocaleString("en");
  if (s.fallback) say(`WebGPU could not be used (${s.fallback}): training on the CPU (WebAssembly).`);
  else if (s.precisionFallback) say(`Training in f32: ${s.precisionFallback}, which f16 mixed precision needs.`);
}

/** The settings the page offers to edit, as [option, label, step or the choices]. */
const SETTINGS = [
  ["arch", "Family", ["gpt2", "llama"]],
  ["layers", "Layers", 1],
  ["heads", "Heads", 1],
  ["kvHeads", "Key/value heads (Llama)", 1],
  ["embd", "Width", 1],
  ["intermediateSize", "SwiGLU width (Llama)", 1],
  ["block", "Block (context)", 1],
  ["batch", "Batch", 1],
  ["iters", "Steps", 1],
  ["lr", "Learning rate", "any"],
  ["minLr", "Final learning rate", "any"],
  ["warmup", "Warm-up steps", 1],
  ["weightDecay", "Weight decay", "any"],
  ["gradClip", "Gradient clip", "any"],
  ["gradAccum", "Gradient accumulation", 1],
  ["dropout", "Dropout", "any"],
];

/** The settings' inputs, built once. */
function buildSettings() {
  for (const [key, label, kind] of SETTINGS) {
    const wrap = document.createElement("label");
    wrap.textContent = `${label} `;
    const input = document.createElement(Array.isArray(kind) ? "select" : "input");
    input.id = `set-${key}`;
    if (Array.isArray(kind)) {
      for (const choice of kind) input.append(new Option(choice, choice));
    } else {
      Object.assign(input, { type: "number", step: String(kind), min: "0" });
    }
    input.onchange = () => {
      showLlamaFields();
      showMemory();
    };
    wrap.append(input);
    $("settings-fields").append(wrap);
  }
}

/** The Llama-only settings shown only for the Llama family. */
function showLlamaFields() {
  const llama = $("set-arch").value === "llama";
  for (const key of ["kvHeads", "intermediateSize"]) $(`set-${key}`).parentElement.hidden = !llama;
}

/** The inputs set to a preset's options (with the URL's over them). */
function fillSettings() {
  const o = { ...preset.options, ...urlOptions(preset.options) };
  for (const [key] of SETTINGS) $(`set-${key}`).value = String(o[key]);
  showLlamaFields();
}

/** The options the settings' inputs give. */
function settingsOptions() {
  const out = {};
  for (const [key, , kind] of SETTINGS) out[key] = Array.isArray(kind) ? $(`set-${key}`).value : Number($(`set-${key}`).value);
  return out;
}

/** The vocabulary a run will have, as far as the page knows before building it: a BPE size
 * chosen, an uploaded tokenizer.json's, or the text's distinct characters. */
async function expectedVocab() {
  const choice = $("tokenizer").value;
  if (choice === "json") {
    const file = $("tokenizer-file").files[0];
    if (!file) return null;
    const t = JSON.parse(await file.text());
    return Object.keys(t.model?.vocab ?? {}).length + (t.added_tokens ?? []).filter((a) => !(a.content in (t.model?.vocab ?? {}))).length;
  }
  if (choice !== "char") return Number(choice);
  if (($("corpus").value === "upload" && !$("upload").files[0]) || ($("corpus").value === "paste" && !$("paste").value)) return null;
  return new Set(await readText()).size;
}

/** Shows the memory the run will plan (Trainer.plan, as `alpha-native info`), or why it will
 * not run, before Start. */
let memoryShown = 0;
async function showMemory() {
  const shown = ++memoryShown;
  const line = $("memory");
  try {
    const vocab = await expectedVocab();
    if (vocab === null || shown !== memoryShown) return;
    const m = Trainer.plan({ ...preset.options, ...urlOptions(preset.options), ...settingsOptions() }, vocab);
    const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
    state.memory = m;
    line.className = "muted";
    line.textContent = `${m.params.toLocaleString("en")} parameters (a vocabulary of ${vocab}): ${mib(m.totalBytes)} of memory, ` +
      `${mib(4 * m.paramsBytes)} for the parameters, their gradients and AdamW's moments, ${mib(m.activationsBytes)} for the activations.`;
  } catch (e) {
    state.memory = null;
    line.className = "error";
    line.textContent = `These settings will not run: ${e instanceof Error ? e.message : e}`;
  }
}

/** The tokenizer options of Trainer.create: a BPE tokenizer learned here (vocabSize), one
 * uploaded (tokenizerJson), or none (the text's characters). */
async function tokenizerOptions() {
  const choice = $("tokenizer").value;
  if (choice === "char") return {};
  if (choice !== "json") return { vocabSize: Number(choice) };
  const file = $("tokenizer-file").files[0];
  if (!file) throw new Error("choose a tokenizer.json to encode the text with");
  return { tokenizerJson: await file.text() };
}

async function createTrainer() {
  state.error = null;
  const text = await readText();
  const backend = backendChoice();
  const tokenizer = await tokenizerOptions();
  const options = { ...preset.options, ...urlOptions(preset.options), ...settingsOptions(), ...tokenizer, backend, recompute: $("recompute").checked };
  say(tokenizer.vocabSize ? `Learning a BPE tokenizer of ${tokenizer.vocabSize} tokens, then building the model…` : "Building the model…");
  trainer = await Trainer.create(options, text);
  state.run = newRun(preset.name);
  iters = options.iters;
  state.records = [];
  state.saved = null;
  state.losses = [];
  state.firstStep = 0;
  state.evals = [];
  state.samples = [];
  state.trainMs = 0;
  state.trainedSteps = 0;
  const s = trainer.stats();
  say(`${s.params.toLocaleString("en")} parameters, vocabulary of ${s.vocab} ${s.tokenizer === "bpe" ? "BPE tokens" : "characters"}.`);
}

/** Shows a record of trainer.next() and keeps it in the page's state. */
function show(r) {
  state.records.push(r);
  switch (r.type) {
    case "train":
      state.losses.push(r.loss);
      $("loss").textContent = r.loss.toFixed(4);
      if (r.mfu != null) $("mfu").textContent = `${(100 * r.mfu).toFixed(1)}%`;
      break;
    case "eval":
      state.evals.push({ step: r.step, train: r.train, val: r.val });
      $("val-loss").textContent = r.val.toFixed(4);
      break;
    case "sample": {
      state.samples.push({ step: r.step, text: r.text });
      const h = document.createElement("h3");
      h.textContent = `step ${r.step}`;
      const pre = document.createElement("pre");
      pre.textContent = r.text;
      $("samples").prepend(h, pre);
      break;
    }
    case "save":
      state.saved = r.step;
      keep(trainer.lastSaved(), r.step);
      break;
  }
}

/** The run's loop, which the library keeps (the CLI's): each call does its next action. */
async function train() {
  running = true;
  state.status = "running";
  updateButtons();
  let painted = performance.now();
  while (running) {
    const started = performance.now();
    const r = await use((t) => t.next());
    if (r.type === "train") {
      state.trainMs += performance.now() - started;
      state.trainedSteps += 1;
    }
    if (r.type === "done") {
      state.status = "done";
      running = false;
      say(`Done: ${r.step} steps.`);
      break;
    }
    show(r);
    // Paint and let the page handle input about every 100 ms.
    if (performance.now() - painted > 100 || r.type !== "train") {
      showStats();
      draw();
      await new Promise((resolve) => setTimeout(resolve, 0));
      painted = performance.now();
    }
  }
  if (state.status === "running") {
    state.status = "paused";
    // A paused run is kept as it is now.
    await use((t) => t.save())
      .then((bytes) => keep(bytes, trainer.stats().step))
      .catch((e) => say(`${e.message ?? e}; the run's last kept save is unchanged`, true));
  }
  showStats();
  updateButtons();
  draw();
}

/** A new run's identity in this browser's store. */
function newRun(name) {
  return { id: `run-${Date.now()}-${Math.random().toString(36).slice(2, 8)}`, name: `${name}, ${new Date().toLocaleString("en")}` };
}

/** The text the page trains on, as a kept run records it: the corpus's name, or the text
 * itself where it was pasted or uploaded. */
async function keptText() {
  return $("corpus").value === "shakespeare" ? { corpus: "shakespeare", text: null } : { corpus: "text", text: await readText() };
}

/** Keeps the run in this browser with checkpoint `bytes` of step `step`; a refusal is said,
 * and the run goes on. */
async function keep(bytes, step) {
  if (!bytes || !state.run) return;
  try {
    await keepRun({ ...state.run, savedAt: Date.now(), step, iters, ...(await keptText()), checkpoint: bytes, records: state.records });
  } catch (e) {
    say(e.message, true);
  }
  await showKeptRuns();
}

/** The runs kept in this browser, each to open, download or delete; the newest offered for
 * resuming after a reload. */
async function showKeptRuns() {
  try {
    state.kept = (await keptRuns()).map(({ checkpoint, text, records, ...about }) => ({ ...about, bytes: checkpoint.length }));
  } catch (e) {
    state.kept = [];
    $("runs-offer").textContent = `This browser does not keep runs: ${e.message ?? e}`;
    $("runs-section").hidden = false;
    return;
  }
  $("runs-section").hidden = state.kept.length === 0;
  const list = $("runs");
  list.replaceChildren();
  for (const run of state.kept) {
    const item = document.createElement("li");
    item.textContent = `${run.name}: step ${run.step} of ${run.iters}, ${(run.bytes / 2 ** 20).toFixed(1)} MiB`;
    for (const [label, action] of [["Open", openKept], ["Download", downloadKept], ["Delete", deleteKept]]) {
      const button = document.createElement("button");
      button.textContent = label;
      button.dataset.action = label.toLowerCase();
      button.onclick = () => action(run.id);
      item.append(button);
    }
    list.append(item);
  }
  const last = state.kept[0];
  const current = state.run?.id === last?.id;
  $("runs-offer").textContent = last && !current ? `Your last run, ${last.name} (step ${last.step} of ${last.iters}), is kept in this browser: Open it to resume.` : "";
}

/** A kept run by id, whole. */
async function keptRun(id) {
  const run = (await keptRuns()).find((r) => r.id === id);
  if (!run) throw new Error("that run is no longer kept in this browser");
  return run;
}

/** Resumes a kept run: its checkpoint on its text, paused at its step. */
async function openKept(id) {
  try {
    const run = await keptRun(id);
    if (run.corpus === "shakespeare") $("corpus").value = "shakespeare";
    else {
      $("corpus").value = "paste";
      $("paste").value = run.text;
    }
    $("paste").hidden = $("corpus").value !== "paste";
    $("upload").hidden = true;
    await loadModel(run.name, (text) => Trainer.load(run.checkpoint, text, { ...cadenceOptions(), backend: backendChoice(), recompute: $("recompute").checked }), run);
  } catch (e) {
    fail(e);
  }
}

async function downloadKept(id) {
  try {
    const run = await keptRun(id);
    saveFile(new Blob([run.checkpoint], { type: "application/octet-stream" }), `alpha-${run.id}-step${run.step}.safetensors`);
  } catch (e) {
    fail(e);
  }
}

async function deleteKept(id) {
  try {
    await forgetRun(id);
    await showKeptRuns();
  } catch (e) {
    fail(e);
  }
}

/** Hands `blob` to the browser as a download named `name`. */
function saveFile(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

function draw() {
  const canvas = $("chart");
  // The x axis is the run's steps from 0: the loss of step k (the k-th update's batch) at k,
  // evaluations at theirs. The plotted range, for tests.
  const lastStep = state.firstStep + state.losses.length;
  const xMax = Math.max(iters, lastStep, 1);
  lineChart(canvas, {
    series: [
      { name: "train", points: state.losses.map((loss, i) => [state.firstStep + i, loss]) },
      { name: "val", points: state.evals.map((e) => [e.step, e.val]), dots: true },
    ],
    xMax,
    xLabel: "step",
    yLabel: "loss",
  });
  Object.assign(canvas.dataset, { firstStep: String(state.firstStep), lastStep: String(lastStep), xMax: String(xMax) });
  drawPhases();
}

/** The phases of a step, as the records name them, and the labels the chart gives them. */
const PHASES = [
  ["data", "data"],
  ["forward", "forward"],
  ["backward", "backward"],
  ["grad_norm", "grad norm"],
  ["optimizer", "AdamW"],
  ["submit", "submit"],
  ["device_wait", "device wait"],
];

/** Where the last steps' time went: their mean ms per phase (those that ran on this
 * backend), the rest of each step's wall time as "other"; and their median MFU. */
function drawPhases() {
  const steps = state.records.filter((r) => r.type === "train" && r.ms).slice(-50);
  const canvas = $("phases");
  if (steps.length === 0) {
    stackedBars(canvas, { bars: [] });
    return;
  }
  const mean = (f) => steps.reduce((t, r) => t + f(r), 0) / steps.length;
  const parts = PHASES.map(([key, name]) => ({ name, value: mean((r) => r.ms[key]) })).filter((p) => p.value > 0);
  const wall = mean((r) => (1e3 * state.stats.tokensPerStep) / r.tokensPerSec);
  parts.push({ name: "other", value: Math.max(0, wall - parts.reduce((t, p) => t + p.value, 0)) });
  const mfus = steps.map((r) => r.mfu).filter((m) => m != null).sort((a, b) => a - b);
  const mfu = mfus.length ? ` · MFU ${(100 * mfus[mfus.length >> 1]).toFixed(1)}% of ${Math.round(state.peak.gflops)} GFLOP/s` : "";
  stackedBars(canvas, { bars: [{ label: `last ${steps.length}`, parts }], unit: "ms", title: `where a step's time goes (mean of the last ${steps.length} steps)${mfu}` });
}

/** The peak GFLOP/s the trainer's MFU is taken against, as alpha-native measures it (the CPU's
 * GEMM on its threads, WebGPU's FMA limit), measured once per browser, backend, kernel or
 * adapter and threads, and kept in localStorage. */
let peakTrainer = null;
async function setPeak({ again = false } = {}) {
  if (peakTrainer === trainer && !again) return;
  const s = trainer.stats();
  const key = `alpha-peak:${s.backend}|${s.kernel ?? (s.adapter || adapterLabel)}|${s.threads}`;
  const cached = Number(localStorage.getItem(key));
  if (cached > 0 && !again) {
    trainer.setPeak(cached);
    state.peak = { gflops: cached, source: "cached" };
  } else {
    say(again ? "Measuring this machine's peak GFLOP/s again…" : "Measuring this machine's peak GFLOP/s once, for MFU…");
    const gflops = await use((t) => t.measurePeak());
    localStorage.setItem(key, String(gflops));
    state.peak = { gflops, source: "measured" };
    if (again) say(`Peak measured again: ${Math.round(gflops)} GFLOP/s; the next steps' MFU is taken against it.`);
  }
  peakTrainer = trainer;
  $("peak").textContent = `MFU against ${Math.round(state.peak.gflops)} GFLOP/s, ${state.peak.source === "cached" ? "measured earlier in this browser" : "measured now"} (${s.backend === "cpu" ? "the CPU's matrix product" : "the GPU's f32 multiply-add limit"}).`;
}

/** The Measure again button: a peak measured while other work shared the machine reads low
 * and every MFU after it high, so the kept one can be replaced. */
async function measurePeakAgain() {
  $("measure-peak").disabled = true;
  try {
    await setPeak({ again: true });
  } catch (e) {
    say(e instanceof Error ? e.message : String(e), true);
  } finally {
    updateButtons();
  }
}

async function start() {
  try {
    if (!trainer) {
      await createTrainer();
      if (trainer.stats().backend === "webgpu") await describeAdapter();
    }
    await setPeak();
    showStats();
    await train();
  } catch (e) {
    fail(e);
  }
}

let stopAsked = false;

/** Streams a continuation of the prompt into the Generate panel until its length, the end of
 * text, or Stop. */
async function generate() {
  const out = $("generated");
  const number = (id) => Number($(id).value);
  const options = { tokens: number("gen-tokens"), temperature: number("gen-temperature"), topK: number("gen-top-k"), topP: number("gen-top-p") };
  state.generation = { status: "running", text: $("prompt").value };
  out.textContent = state.generation.text;
  stopAsked = false;
  updateButtons();
  try {
    await use((t) =>
      t.generate($("prompt").value, options, (piece) => {
        state.generation.text += piece;
        out.textContent = state.generation.text;
        return !stopAsked;
      }),
    );
  } catch (e) {
    say(e instanceof Error ? e.message : String(e), true);
  } finally {
    state.generation.status = "idle";
    updateButtons();
  }
}

async function download() {
  try {
    // The model now, or, where it cannot be saved (not finite), the run's last checkpoint.
    const bytes = await use((t) =>
      t.save().catch((e) => {
        const last = t.lastSaved();
        if (!last) throw e;
        say(`${e.message ?? e}; downloading the last checkpoint the run saved (step ${state.saved}).`, true);
        return last;
      }),
    );
    saveFile(new Blob([bytes], { type: "application/octet-stream" }), `alpha-step${trainer.stats().step}.safetensors`);
  } catch (e) {
    fail(e);
  }
}

/** The page's cadence (evaluations, samples, checkpoints) for a loaded model: the preset's. */
function cadenceOptions() {
  const o = { ...preset.options, ...urlOptions(preset.options) };
  return { evalInterval: o.evalInterval, evalIters: o.evalIters, sampleInterval: o.sampleInterval, checkpointInterval: o.checkpointInterval, logInterval: o.logInterval };
}

/** Replaces the model with the one `open(text)` resolves to (a checkpoint, a Hugging Face
 * model), paused at its step; `what` names it in the messages. It is a new run in this
 * browser's store unless `run` (a kept one's `{ id, name }`) says which it continues. */
async function loadModel(what, open, run = null) {
  try {
    running = false;
    await queue;
    const text = await readText();
    say(`Loading ${what}…`);
    state.error = null;
    trainer = await open(text);
    state.run = run ? { id: run.id, name: run.name } : newRun(what);
    const s = trainer.stats();
    // Train to the run's planned length (or the steps= parameter's); a finished run goes on
    // for another preset's length, as `alpha-native train --resume --iters N` would.
    const planned = params.has("steps") ? Number(params.get("steps")) : s.iters;
    iters = planned > s.step ? planned : s.step + preset.options.iters;
    trainer.setIters(iters);
    state.losses = [];
    state.firstStep = s.step;
    state.evals = [];
    state.records = [];
    state.saved = null;
    state.trainMs = 0;
    state.trainedSteps = 0;
    state.status = "paused";
    showStats();
    draw();
    say(`Loaded ${what}: step ${s.step} of ${iters}, ${s.params.toLocaleString("en")} parameters. Generate from it, or press Resume to train it on the text.`);
    updateButtons();
  } catch (e) {
    fail(e);
  }
}

/** A checkpoint file (alpha-native's or the page's): the model and the optimisation come
 * from it, the cadence from the preset. */
function uploadCheckpoint(file) {
  return loadModel(file.name, async (text) => {
    const bytes = new Uint8Array(await file.arrayBuffer());
    return Trainer.load(bytes, text, { ...cadenceOptions(), backend: backendChoice(), recompute: $("recompute").checked });
  });
}

/** A Hugging Face model's files (config.json, tokenizer.json, model.safetensors or its
 * shards), picked or dropped, to sample from or fine-tune with the preset's settings; its
 * context cut to the preset's block where that is shorter. */
function loadHuggingFace(files) {
  const byName = new Map([...files].map((f) => [f.name, f]));
  const shards = [...byName.keys()].filter((n) => n.endsWith(".safetensors")).sort();
  const missing = ["config.json", "tokenizer.json"].filter((n) => !byName.has(n));
  if (shards.length === 0) missing.push("model.safetensors");
  if (missing.length > 0) return fail(`a Hugging Face model is config.json, tokenizer.json and model.safetensors (or its shards); missing: ${missing.join(", ")}`);
  return loadModel("the Hugging Face model", async (text) => {
    const config = await byName.get("config.json").text();
    const context = JSON.parse(config).n_positions ?? JSON.parse(config).max_position_embeddings;
    const bytes = async (name) => new Uint8Array(await byName.get(name).arrayBuffer());
    const weights = byName.has("model.safetensors") ? await bytes("model.safetensors") : await Promise.all(shards.map(async (n) => [n, await bytes(n)]));
    const o = { ...preset.options, ...urlOptions(preset.options) };
    const settings = { lr: o.lr, minLr: o.minLr, warmup: o.warmup, batch: o.batch, block: Math.min(o.block, context ?? o.block), iters: o.iters };
    return Trainer.loadHuggingFace(config, await byName.get("tokenizer.json").text(), weights, text, { ...cadenceOptions(), ...settings, backend: backendChoice(), recompute: $("recompute").checked });
  });
}

/** The model as a Hugging Face directory, downloaded as one .zip. */
async function exportHuggingFace() {
  try {
    const files = await use((t) => t.exportHuggingFace());
    saveFile(zip(files), `alpha-step${trainer.stats().step}-hf.zip`);
  } catch (e) {
    fail(e);
  }
}

function setup() {
  for (const p of Trainer.presets()) {
    PRESETS[p.name] = p;
    const option = document.createElement("option");
    option.value = p.name;
    option.textContent = presetLabel(p.name, p.options);
    option.title = p.description;
    $("preset").append(option);
  }
  const presetName = params.get("preset") ?? "tiny";
  if (!PRESETS[presetName]) return fail(`unknown preset ${presetName}; presets: ${Object.keys(PRESETS).join(", ")}`);
  if (!WASM_BUILDS[wasmBuild]) return fail(`unknown wasm build ${wasmBuild}; builds: ${Object.keys(WASM_BUILDS).join(", ")}`);
  state.wasmBuild = loaded.name;
  // Without cross-origin isolation there are no WebAssembly threads: say so.
  $("isolation").hidden = globalThis.crossOriginIsolated === true;
  $("preset").value = presetName;
  preset = PRESETS[presetName];
  $("backend").value = params.get("backend") ?? "auto";
  $("recompute").checked = params.get("recompute") === "1";
  $("tokenizer").value = params.get("tokenizer") ?? "char";
  const showPreset = () => {
    const o = { ...preset.options, ...urlOptions(preset.options) };
    const about = preset.description.charAt(0).toUpperCase() + preset.description.slice(1);
    $("preset-info").textContent = `${about} ${o.iters} steps, evaluation every ${o.evalInterval}, a sample every ${o.sampleInterval}.`;
  };
  showPreset();
  buildSettings();
  fillSettings();
  showMemory();
  const reset = () => {
    running = false;
    trainer = null;
    state.status = "idle";
    updateButtons();
  };
  $("preset").onchange = () => {
    preset = PRESETS[$("preset").value];
    showPreset();
    fillSettings();
    showMemory();
    reset();
  };
  $("backend").onchange = reset;
  $("tokenizer").onchange = () => {
    $("tokenizer-file").hidden = $("tokenizer").value !== "json";
    showMemory();
    reset();
  };
  $("tokenizer-file").onchange = () => {
    showMemory();
    reset();
  };
  $("recompute").onchange = reset;
  $("corpus").onchange = () => {
    $("paste").hidden = $("corpus").value !== "paste";
    $("upload").hidden = $("corpus").value !== "upload";
    showMemory();
    reset();
  };
  $("paste").onchange = showMemory;
  $("upload").onchange = showMemory;
  // A new setting is a new model.
  $("settings-fields").addEventListener("change", reset);
  $("start").onclick = start;
  $("generate").onclick = generate;
  $("stop").onclick = () => (stopAsked = true);
  $("measure-peak").onclick = measurePeakAgain;
  $("pause").onclick = () => (running = false);
  $("download").onclick = download;
  $("checkpoint").onchange = (e) => e.target.files[0] && uploadCheckpoint(e.target.files[0]);
  $("hf-files").onchange = (e) => e.target.files.length > 0 && loadHuggingFace(e.target.files);
  $("export-hf").onclick = exportHuggingFace;
  // Files dropped on the setup box: a Hugging Face model's.
  $("setup").ondragover = (e) => e.preventDefault();
  $("setup").ondrop = (e) => {
    e.preventDefault();
    if (e.dataTransfer.files.length > 0) loadHuggingFace(e.dataTransfer.files);
  };
  state.status = "idle";
  updateButtons();
  showKeptRuns();
  if (params.get("autostart") === "1") start();
}

init()
  .then(setup)
  .catch(fail);
