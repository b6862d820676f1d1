// Tokens/s of a preset (tiny by default) in one run, in steady state as `alpha-native bench`
// measures it (warm-up steps, then timed ones; medians): in the page (WebGPU on SwiftShader,
// the CPU in the three WebAssembly builds, the threads build on one thread and on two) and
// natively (CPU on 1 and 2 threads, GPU on the default adapter, lavapipe without a GPU).
//   node www/bench.mjs [rounds] [preset]   (after `cargo build --release` and
//   scripts/build-web.sh; ALPHA_NATIVE=path overrides the workspace's target/release/alpha-native)

import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { launchChromium, startServer } from "./browser.mjs";

const native = process.env.ALPHA_NATIVE ?? fileURLToPath(new URL("../target/release/alpha-native", import.meta.url));
if (!existsSync(native)) throw new Error(`${native} not found: run \`cargo build --release\` first, or set ALPHA_NATIVE`);
const rounds = Number(process.argv[2] ?? 3);
const presetName = process.argv[3] ?? "tiny";
// Mesa (lavapipe) wants a private runtime directory, as in scripts/test.sh.
const env = { ...process.env, XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? mkdtempSync(join(tmpdir(), "alpha-xdg-")) };
/** The preset's model as alpha-native flags (read from the page, which reads the library's). */
let MODEL = [];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// In the page: the wasm JIT compiles its optimised code while the first steps run (about 150
// steps of this preset in Chromium), hence the long CPU warm-up. `repeats` timings of `timed`
// steps each; the result is the median ms per step. `build` names one of the page's WASM_BUILDS.
// Step counts are the tiny preset's; larger presets divide them by `scale`.
const scale = { tiny: 1, small: 10 }[presetName] ?? 50;
const steps = (n) => Math.max(3, Math.round(n / scale));
const PAGE_RUNS = {
  "page, CPU (WebAssembly, relaxed SIMD)": { build: "relaxed", backend: "cpu", threads: 1, warmup: steps(250), timed: steps(100), repeats: 5 },
  "page, CPU (WebAssembly, SIMD128)": { build: "simd128", backend: "cpu", threads: 1, warmup: steps(250), timed: steps(100), repeats: 5 },
  "page, CPU (WebAssembly threads, 1)": { build: "threads", backend: "cpu", threads: 1, warmup: steps(250), timed: steps(100), repeats: 5 },
  "page, CPU (WebAssembly threads, 2)": { build: "threads", backend: "cpu", threads: 2, warmup: steps(250), timed: steps(100), repeats: 5 },
  "page, WebGPU (SwiftShader)": { build: "simd128", backend: "webgpu", threads: 1, warmup: 5, timed: steps(10), repeats: 3 },
};
const NATIVE_RUNS = {
  "native CPU, 1 thread": ["--threads", "1", "--iters", String(steps(1000))],
  "native CPU, 2 threads": ["--threads", "2", "--iters", String(steps(1000))],
  "native GPU (lavapipe)": ["--backend", "gpu", "--iters", String(steps(40))],
};

/** Tokens/s of one page run (see PAGE_RUNS). */
async function pageTokensPerSec(browser, base, run) {
  const page = await browser.newPage();
  await page.goto(`${base}?preset=${presetName}&wasm=${run.build}`);
  await page.waitForFunction(() => window.alpha?.status === "idle");
  const { perStep, tokensPerStep } = await page.evaluate(async ({ run: { backend, threads, warmup, timed, repeats }, presetName }) => {
    const { PRESETS, Trainer } = await import("./main.js");
    const text = await (await fetch("data/shakespeare.txt")).text();
    const t = await Trainer.create({ ...PRESETS[presetName].options, backend, threads }, text);
    await t.step(warmup);
    const perStep = [];
    for (let r = 0; r < repeats; r++) {
      const started = performance.now();
      await t.step(timed);
      perStep.push((performance.now() - started) / timed);
    }
    return { perStep, tokensPerStep: t.stats().tokensPerStep };
  }, { run, presetName });
  await page.close();
  return tokensPerStep / (median(perStep) / 1e3);
}

const server = await startServer();
const browser = await launchChromium();
{
  const page = await browser.newPage();
  await page.goto(`${server.base}?preset=${presetName}`);
  await page.waitForFunction(() => window.alpha?.status === "idle");
  const o = await page.evaluate(async (name) => (await import("./main.js")).PRESETS[name].options, presetName);
  MODEL = ["layers", "heads", "embd", "block", "batch"].flatMap((k) => [`--${k}`, String(o[k])]);
  await page.close();
}
const tokensPerSec = Object.fromEntries([...Object.keys(PAGE_RUNS), ...Object.keys(NATIVE_RUNS)].map((name) => [name, []]));
for (let r = 0; r < rounds; r++) {
  for (const [name, run] of Object.entries(PAGE_RUNS)) {
    tokensPerSec[name].push(await pageTokensPerSec(browser, server.base, run));
  }
  for (const [name, extra] of Object.entries(NATIVE_RUNS)) {
    const out = execFileSync(native, ["bench", ...MODEL, ...extra, "--warmup", "5", "--json", "--peak-gflops", "1"], { encoding: "utf8", env });
    tokensPerSec[name].push(JSON.parse(out).tokens_per_sec);
  }
}
await browser.close();
server.stop();
console.log(`${presetName} preset, steady state, median of ${rounds} rounds`);
for (const [name, xs] of Object.entries(tokensPerSec)) {
  console.log(`${name.padEnd(38)} ${Math.round(median(xs)).toString().padStart(8)} tokens/s   (${xs.map(Math.round).join(", ")})`);
}
const rate = (name) => median(tokensPerSec[name]);
const nativeCpu = rate("native CPU, 1 thread");
for (const name of ["page, CPU (WebAssembly, relaxed SIMD)", "page, CPU (WebAssembly, SIMD128)", "page, CPU (WebAssembly threads, 1)"]) {
  console.log(`${name} / native CPU (1 thread): ${(rate(name) / nativeCpu).toFixed(2)}x`);
}
const [one, two] = [rate("page, CPU (WebAssembly threads, 1)"), rate("page, CPU (WebAssembly threads, 2)")];
console.log(`page, CPU threads: 2 / 1 thread ${(two / one).toFixed(2)}x; 2 threads / native CPU (2 threads) ${(two / rate("native CPU, 2 threads")).toFixed(2)}x`);
