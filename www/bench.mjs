// Tokens/s of the tiny preset in one run, in steady state as `alpha-native bench` measures
// it (warm-up steps, then timed ones; medians): in the page (WebGPU on SwiftShader, and the
// CPU in both WebAssembly builds) and natively (CPU on 1 thread, GPU on the default adapter,
// lavapipe without a GPU).
//   node www/bench.mjs [rounds]   (after `cargo build --release` and scripts/build-web.sh;
//   ALPHA_NATIVE=path overrides the workspace's target/release/alpha-native)

import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { launchChromium, startServer } from "./browser.mjs";

const native = process.env.ALPHA_NATIVE ?? fileURLToPath(new URL("../target/release/alpha-native", import.meta.url));
if (!existsSync(native)) throw new Error(`${native} not found: run \`cargo build --release\` first, or set ALPHA_NATIVE`);
const rounds = Number(process.argv[2] ?? 3);
// Mesa (lavapipe) wants a private runtime directory, as in scripts/test.sh.
const env = { ...process.env, XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? mkdtempSync(join(tmpdir(), "alpha-xdg-")) };
const MODEL = ["--layers", "2", "--heads", "2", "--embd", "32", "--block", "32", "--batch", "8"];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

// In the page: the wasm JIT compiles its optimised code while the first steps run (about 150
// steps of this preset in Chromium), hence the long CPU warm-up. `repeats` timings of `timed`
// steps each; the result is the median ms per step. `build` names one of the page's WASM_BUILDS.
const PAGE_RUNS = {
  "page, CPU (WebAssembly, relaxed SIMD)": { build: "relaxed", backend: "cpu", warmup: 250, timed: 100, repeats: 5 },
  "page, CPU (WebAssembly, SIMD128)": { build: "simd128", backend: "cpu", warmup: 250, timed: 100, repeats: 5 },
  "page, WebGPU (SwiftShader)": { build: "simd128", backend: "webgpu", warmup: 5, timed: 10, repeats: 3 },
};
const NATIVE_RUNS = {
  "native CPU, 1 thread": ["--threads", "1", "--iters", "1000"],
  "native GPU (lavapipe)": ["--backend", "gpu", "--iters", "40"],
};

/** Tokens/s of one page run (see PAGE_RUNS). */
async function pageTokensPerSec(browser, base, run) {
  const page = await browser.newPage();
  await page.goto(`${base}?preset=tiny`);
  await page.waitForFunction(() => window.alpha?.status === "idle");
  const { perStep, tokensPerStep } = await page.evaluate(async ({ build, backend, warmup, timed, repeats }) => {
    const { PRESETS, WASM_BUILDS } = await import("./main.js");
    const { default: init, Trainer } = await import(WASM_BUILDS[build]);
    await init();
    const text = await (await fetch("data/shakespeare.txt")).text();
    const t = await Trainer.create({ ...PRESETS.tiny.options, backend }, text);
    await t.step(warmup);
    const perStep = [];
    for (let r = 0; r < repeats; r++) {
      const started = performance.now();
      await t.step(timed);
      perStep.push((performance.now() - started) / timed);
    }
    return { perStep, tokensPerStep: t.stats().tokensPerStep };
  }, run);
  await page.close();
  return tokensPerStep / (median(perStep) / 1e3);
}

const server = await startServer();
const browser = await launchChromium();
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
console.log(`tiny preset (2 layers, 32 wide, block 32, batch 8: 256 tokens/step), steady state, median of ${rounds} rounds`);
for (const [name, xs] of Object.entries(tokensPerSec)) {
  console.log(`${name.padEnd(38)} ${Math.round(median(xs)).toString().padStart(8)} tokens/s   (${xs.map(Math.round).join(", ")})`);
}
const nativeCpu = median(tokensPerSec["native CPU, 1 thread"]);
for (const name of ["page, CPU (WebAssembly, relaxed SIMD)", "page, CPU (WebAssembly, SIMD128)"]) {
  console.log(`${name} / native CPU (1 thread): ${(median(tokensPerSec[name]) / nativeCpu).toFixed(2)}x`);
}
