// The demo page: pick a text and a model, train it with alpha-web (WebGPU or the CPU in
// WebAssembly), watch the losses and samples, save and load checkpoints.
//
// URL parameters (for links and tests): backend=auto|webgpu|cpu, preset=<name>, steps=N (stop
// after N steps), seed=N, recompute=1, autostart=1, wasm=relaxed|simd128 (which build, below).
// window.alpha exposes the page's state.

const params = new URLSearchParams(location.search);

// alpha-web comes in two WebAssembly builds (scripts/build-web.sh): pkg/ with SIMD128, which
// every current browser runs, and pkg-relaxed/, whose CPU kernels also use relaxed SIMD's
// fused multiply-add. The page loads the second where the browser validates a module with
// f32x4.relaxed_madd (this one: () -> v128, three i8x16.splat and the madd).
const RELAXED_SIMD_PROBE = new Uint8Array([
  0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 19, 1, 17, 0,
  65, 1, 253, 15, 65, 1, 253, 15, 65, 1, 253, 15, 253, 133, 2, 11,
]);
/** The builds, by the name the `wasm` URL parameter takes. */
export const WASM_BUILDS = { relaxed: "./pkg-relaxed/alpha_web.js", simd128: "./pkg/alpha_web.js" };
const wasmBuild = params.get("wasm") ?? (WebAssembly.validate(RELAXED_SIMD_PROBE) ? "relaxed" : "simd128");
const { default: init, Trainer } = await import(WASM_BUILDS[wasmBuild] ?? WASM_BUILDS.simd128).catch((e) => {
  if (wasmBuild !== "relaxed") throw e;
  console.warn(`pkg-relaxed/ did not load (${e}); using pkg/`);
  return import(WASM_BUILDS.simd128);
});

/** Model presets: options for Trainer.create, and how often to evaluate and sample. */
export const PRESETS = {
  tiny: {
    label: "tiny: 2 layers, 2 heads, 32 wide, block 32, batch 8",
    options: { layers: 2, heads: 2, embd: 32, block: 32, batch: 8, lr: 3e-3, warmup: 10, iters: 300, evalIters: 5 },
    evalInterval: 25,
    sampleInterval: 100,
  },
  small: {
    label: "small: 4 layers, 4 heads, 64 wide, block 64, batch 12",
    options: { layers: 4, heads: 4, embd: 64, block: 64, batch: 12, lr: 2e-3, warmup: 50, iters: 1000, evalIters: 10 },
    evalInterval: 100,
    sampleInterval: 250,
  },
  nanogpt: {
    label: "nanoGPT's Shakespeare-char CPU run: 4 layers, 4 heads, 128 wide, block 64, batch 12",
    options: { layers: 4, heads: 4, embd: 128, block: 64, batch: 12, lr: 1e-3, warmup: 100, iters: 2000, evalIters: 20 },
    evalInterval: 250,
    sampleInterval: 500,
  },
};

const $ = (id) => document.getElementById(id);

/** The page's state, for people and tests. */
const state = {
  status: "loading", // loading | idle | running | paused | done | error
  losses: [], // one per step trained in this page, from step firstStep on
  firstStep: 0, // the step the model was at when this page began training it (a loaded checkpoint's)
  evals: [], // { step, train, val }
  samples: [], // { step, text }
  trainMs: 0, // time spent in steps (not evaluations or samples) since the page started training
  trainedSteps: 0,
  stats: null,
  error: null,
  message: "",
};
window.alpha = state;

let trainer = null;
let preset = PRESETS.tiny;
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
  $("start").disabled = running;
  $("start").textContent = trainer && state.status === "paused" ? "Resume" : "Start";
  $("pause").disabled = !running;
  $("download").disabled = !trainer || running;
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
    s.backend === "webgpu" ? `WebGPU (${s.adapter || adapterLabel || "default adapter"})` : `CPU (WebAssembly, ${s.kernel === "wasm-relaxed-simd" ? "relaxed SIMD" : "SIMD128"})`;
  $("step").textContent = String(s.step);
  if (state.trainMs > 0) $("tok-s").textContent = Math.round(tokensPerSec()).toLocaleString("en");
  if (s.fallback) say(`WebGPU could not be used (${s.fallback}): training on the CPU (WebAssembly).`);
}

async function createTrainer() {
  const text = await readText();
  const backend = backendChoice();
  const options = { ...preset.options, backend, recompute: $("recompute").checked };
  if (params.has("seed")) options.seed = Number(params.get("seed"));
  say("Building the model…");
  trainer = await Trainer.create(options, text);
  iters = params.has("steps") ? Number(params.get("steps")) : preset.options.iters;
  state.losses = [];
  state.firstStep = 0;
  state.evals = [];
  state.samples = [];
  state.trainMs = 0;
  state.trainedSteps = 0;
  say(`${trainer.stats().params.toLocaleString("en")} parameters, vocabulary of ${trainer.stats().vocab} characters.`);
}

async function evaluate(step) {
  const { train, val } = await use((t) => t.evaluate());
  state.evals.push({ step, train, val });
  $("val-loss").textContent = val.toFixed(4);
}

async function sample(step) {
  const text = await use((t) => t.sample("\n", 200, 0.8));
  state.samples.push({ step, text });
  const h = document.createElement("h3");
  h.textContent = `step ${step}`;
  const pre = document.createElement("pre");
  pre.textContent = text;
  $("samples").prepend(h, pre);
}

async function train() {
  running = true;
  state.status = "running";
  updateButtons();
  let chunk = 1;
  while (running) {
    const step = trainer.stats().step;
    if (step % preset.evalInterval === 0 || step >= iters) {
      if (!state.evals.some((e) => e.step === step)) await evaluate(step);
    }
    if (step > 0 && (step % preset.sampleInterval === 0 || step >= iters)) {
      if (!state.samples.some((s) => s.step === step)) await sample(step);
    }
    if (step >= iters) {
      state.status = "done";
      running = false;
      say(`Done: ${step} steps.`);
      break;
    }
    // Steps until the next evaluation, sample or the end, in chunks of about 100 ms.
    const next = Math.min(iters, (Math.floor(step / preset.evalInterval) + 1) * preset.evalInterval, (Math.floor(step / preset.sampleInterval) + 1) * preset.sampleInterval);
    const n = Math.max(1, Math.min(chunk, next - step));
    const started = performance.now();
    const losses = await use((t) => t.step(n));
    const ms = performance.now() - started;
    state.trainMs += ms;
    state.trainedSteps += n;
    chunk = Math.max(1, Math.min(50, Math.round((n * 100) / Math.max(ms, 1))));
    state.losses.push(...losses);
    $("loss").textContent = losses[losses.length - 1].toFixed(4);
    showStats();
    draw();
    // Let the page paint and handle input between chunks.
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  if (state.status === "running") state.status = "paused";
  updateButtons();
  draw();
}

function draw() {
  const canvas = $("chart");
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const points = state.losses.length + state.evals.length;
  // The x axis is the run's steps from 0: the loss of step k (the k-th update's batch) at k,
  // evaluations at theirs. The plotted range, for tests.
  const lastStep = state.firstStep + state.losses.length;
  const xMax = Math.max(iters, lastStep, 1);
  Object.assign(canvas.dataset, { points: String(points), firstStep: String(state.firstStep), lastStep: String(lastStep), xMax: String(xMax) });
  if (points === 0) return;
  const all = [...state.losses, ...state.evals.map((e) => e.val)];
  const lo = Math.min(...all);
  const hi = Math.max(...all);
  const pad = 30;
  const x = (step) => pad + ((width - 2 * pad) * step) / xMax;
  const y = (loss) => height - pad - ((height - 2 * pad) * (loss - lo)) / Math.max(hi - lo, 1e-6);
  ctx.strokeStyle = "#ccd";
  ctx.strokeRect(pad, pad, width - 2 * pad, height - 2 * pad);
  ctx.fillStyle = "#556";
  ctx.font = "12px system-ui";
  ctx.fillText(hi.toFixed(2), 2, pad + 4);
  ctx.fillText(lo.toFixed(2), 2, height - pad);
  ctx.fillText(`step ${xMax}`, width - pad - 50, height - 8);
  ctx.strokeStyle = "#3366cc";
  ctx.beginPath();
  state.losses.forEach((loss, i) => (i === 0 ? ctx.moveTo : ctx.lineTo).call(ctx, x(state.firstStep + i), y(loss)));
  ctx.stroke();
  ctx.fillStyle = "#dc6b19";
  for (const e of state.evals) {
    ctx.beginPath();
    ctx.arc(x(e.step), y(e.val), 4, 0, 2 * Math.PI);
    ctx.fill();
  }
}

async function start() {
  try {
    if (!trainer) {
      await createTrainer();
      if (trainer.stats().backend === "webgpu") await describeAdapter();
    }
    showStats();
    await train();
  } catch (e) {
    fail(e);
  }
}

async function download() {
  try {
    const bytes = await use((t) => t.save());
    const url = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = `alpha-step${trainer.stats().step}.safetensors`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (e) {
    fail(e);
  }
}

async function uploadCheckpoint(file) {
  try {
    running = false;
    await queue;
    const bytes = new Uint8Array(await file.arrayBuffer());
    const text = await readText();
    say("Loading the checkpoint…");
    trainer = await Trainer.load(bytes, text, { backend: backendChoice(), recompute: $("recompute").checked });
    const s = trainer.stats();
    // Train to the run's planned length (or the steps= parameter's); a finished run goes on
    // for another preset's length, as `alpha-native train --resume --iters N` would.
    const planned = params.has("steps") ? Number(params.get("steps")) : s.iters;
    iters = planned > s.step ? planned : s.step + preset.options.iters;
    trainer.setIters(iters);
    state.losses = [];
    state.firstStep = s.step;
    state.evals = [];
    state.trainMs = 0;
    state.trainedSteps = 0;
    state.status = "paused";
    showStats();
    draw();
    say(`Loaded ${file.name}: step ${s.step} of ${iters}, ${s.params.toLocaleString("en")} parameters. Press Resume to continue.`);
    updateButtons();
  } catch (e) {
    fail(e);
  }
}

function setup() {
  for (const [name, p] of Object.entries(PRESETS)) {
    const option = document.createElement("option");
    option.value = name;
    option.textContent = p.label;
    $("preset").append(option);
  }
  const presetName = params.get("preset") ?? "tiny";
  if (!PRESETS[presetName]) return fail(`unknown preset ${presetName}; presets: ${Object.keys(PRESETS).join(", ")}`);
  if (!WASM_BUILDS[wasmBuild]) return fail(`unknown wasm build ${wasmBuild}; builds: ${Object.keys(WASM_BUILDS).join(", ")}`);
  $("preset").value = presetName;
  preset = PRESETS[presetName];
  $("backend").value = params.get("backend") ?? "auto";
  $("recompute").checked = params.get("recompute") === "1";
  const showPreset = () => ($("preset-info").textContent = `${preset.options.iters} steps, evaluation every ${preset.evalInterval}, a sample every ${preset.sampleInterval}.`);
  showPreset();
  const reset = () => {
    running = false;
    trainer = null;
    state.status = "idle";
    updateButtons();
  };
  $("preset").onchange = () => {
    preset = PRESETS[$("preset").value];
    showPreset();
    reset();
  };
  $("backend").onchange = reset;
  $("recompute").onchange = reset;
  $("corpus").onchange = () => {
    $("paste").hidden = $("corpus").value !== "paste";
    $("upload").hidden = $("corpus").value !== "upload";
    reset();
  };
  $("start").onclick = start;
  $("pause").onclick = () => (running = false);
  $("download").onclick = download;
  $("checkpoint").onchange = (e) => e.target.files[0] && uploadCheckpoint(e.target.files[0]);
  state.status = "idle";
  updateButtons();
  if (params.get("autostart") === "1") start();
}

init()
  .then(setup)
  .catch(fail);
