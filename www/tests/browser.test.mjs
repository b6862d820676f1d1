// The demo in a real browser: Debian's Chromium (never a downloaded one) driven by
// playwright-core, WebGPU on SwiftShader. Needs scripts/build-web.sh's www/pkg and
// www/pkg-relaxed and the alpha-native binary in $ALPHA_NATIVE (scripts/test.sh provides
// them). Screenshots go to www/test-results/.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { finished, launchChromium, startServer } from "../browser.mjs";

const www = fileURLToPath(new URL("..", import.meta.url));
const results = join(www, "test-results");
const native = process.env.ALPHA_NATIVE;
const work = mkdtempSync(join(tmpdir(), "alpha-www-"));
// The peaks alpha-native measures here (a test build's, lower than a release build's) are
// cached with the tests' files, not in the user's cache.
process.env.ALPHA_CACHE_DIR = join(work, "peak-cache");
mkdirSync(results, { recursive: true });

// The tiny preset's model, as alpha-native flags.
const TINY = ["--layers", "2", "--heads", "2", "--embd", "32", "--block", "32", "--batch", "8", "--lr", "3e-3", "--warmup", "10"];
const STEPS = 30;
// Steps whose losses must equal alpha-native's: the warm-up, where the learning rate does not
// depend on the run's length.
const PARITY_STEPS = 10;

let server;
let base;
let browser;
const pageLosses = {};
// The precision the WebGPU run trained in (its test sets it).
let webgpuPrecision = null;

before(async () => {
  assert.ok(native, "set ALPHA_NATIVE to the alpha-native binary (scripts/test.sh does)");
  server = await startServer();
  base = server.base;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.stop();
  rmSync(work, { recursive: true, force: true });
});

// How long a page's actions and waits may take: slow shared machines take more than
// playwright's default 30 s for a step of the page (loading a model, a generation's first
// tokens) now and then.
const PAGE_TIMEOUT_MS = 120_000;

/** A new page (playwright's `browser.newPage(options)`) that waits up to PAGE_TIMEOUT_MS. */
async function newPage(options = {}) {
  const page = await browser.newPage(options);
  page.setDefaultTimeout(PAGE_TIMEOUT_MS);
  return page;
}

/** A new browser context (`browser.newContext(options)`) whose pages wait up to PAGE_TIMEOUT_MS. */
async function newContext(options = {}) {
  const context = await browser.newContext(options);
  context.setDefaultTimeout(PAGE_TIMEOUT_MS);
  return context;
}

/** A page at `query` whose console errors and uncaught exceptions are collected. */
async function open(query = "") {
  const page = await newPage({ acceptDownloads: true });
  const errors = [];
  page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(`${base}${query}`);
  return { page, errors };
}

const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

test("the page loads with no console errors", async () => {
  const { page, errors } = await open();
  await page.waitForFunction(() => window.alpha?.status === "idle");
  assert.deepEqual(errors, []);
  assert.match(await page.title(), /Alpha/);
  assert.ok((await page.locator("#preset option").count()) >= 3);
  await page.close();
});

// WebGPU, and the CPU path in all three WebAssembly builds (the page is cross-origin isolated
// and Chromium validates relaxed SIMD, so it picks pkg-threads, on every core, unless told
// otherwise).
const RUNS = [
  ["webgpu", "webgpu", "", /^WebGPU \(.*\), (f16|f32 \(no shader-f16\))$/],
  ["cpu", "cpu", "", /^CPU \(WebAssembly, relaxed SIMD, [2-9]\d* threads\)$/],
  ["cpu-relaxed", "cpu", "&wasm=relaxed", /^CPU \(WebAssembly, relaxed SIMD, 1 thread\)$/],
  ["cpu-simd128", "cpu", "&wasm=simd128", /^CPU \(WebAssembly, SIMD128, 1 thread\)$/],
];

for (const [run, backend, extra, shown] of RUNS) {
  test(`${run}: ${STEPS} steps of the tiny preset, the loss goes down, chart and sample appear`, async () => {
    const { page, errors } = await open(`?backend=${backend}&preset=tiny&steps=${STEPS}&autostart=1${extra}`);
    const s = await finished(page);
    assert.equal(s.error, null);
    assert.equal(s.stats.backend, backend);
    assert.equal(s.losses.length, STEPS);
    assert.ok(mean(s.losses.slice(-5)) < mean(s.losses.slice(0, 5)) - 0.1, `losses: ${s.losses.join(", ")}`);
    assert.deepEqual(s.evals.map((e) => e.step), [0, 25, STEPS]);
    assert.ok(s.evals.at(-1).val < s.evals[0].val, JSON.stringify(s.evals));
    assert.match(await page.locator("#backend-name").textContent(), shown);
    if (backend === "webgpu") {
      // f16 mixed precision where the adapter has shader-f16; else f32, and the page says why
      // (SwiftShader has none).
      const f16 = s.stats.precision === "f16";
      assert.ok(f16 ? s.stats.precisionFallback === null : /lacks shader-f16/.test(s.stats.precisionFallback), JSON.stringify(s.stats));
      webgpuPrecision = s.stats.precision;
    }
    assert.equal(await page.locator("#step").textContent(), String(STEPS));
    assert.ok(Number(await page.locator("#chart").getAttribute("data-points")) >= STEPS + 3);
    const sample = await page.locator("#samples pre").first().textContent();
    assert.equal(sample.length, 200);
    assert.ok(Number((await page.locator("#tok-s").textContent()).replace(/,/g, "")) > 0);
    // Each step's record carries its phases and MFU against the peak the page measured once
    // (the CPU's GEMM, WebGPU's FMA limit), beside the loss chart.
    const steps = s.records.filter((r) => r.type === "train");
    const phases = backend === "webgpu" ? ["submit", "device_wait"] : ["forward", "backward", "optimizer"];
    for (const r of steps) {
      phases.forEach((p) => assert.ok(r.ms[p] > 0, `step ${r.step}: ${p} ${JSON.stringify(r.ms)}`));
      assert.ok(r.mfu > 0 && r.mfu < 1, `step ${r.step}: MFU ${r.mfu}`);
      // MFU is the model's FLOPs per token at the step's tokens/s over the peak: the same
      // FLOPs per token every step, between 6 and 12 per parameter (the weights' products
      // and attention's).
      const flopsPerToken = (r.mfu * s.peak.gflops * 1e9) / r.tokensPerSec;
      assert.ok(Math.abs(flopsPerToken / ((steps[0].mfu * s.peak.gflops * 1e9) / steps[0].tokensPerSec) - 1) < 1e-9);
      assert.ok(flopsPerToken > 6 * s.stats.params && flopsPerToken < 12 * s.stats.params, `${flopsPerToken} FLOPs per token, ${s.stats.params} parameters`);
    }
    assert.ok(s.peak.gflops > 0, JSON.stringify(s.peak));
    assert.match(await page.locator("#mfu").textContent(), /^\d+\.\d%$/);
    assert.ok(Number(await page.locator("#phases").getAttribute("data-series")) >= phases.length + 1);
    await page.screenshot({ path: join(results, `training-${run}.png`), fullPage: true });
    assert.deepEqual(errors, []);
    pageLosses[run] = s.losses.slice(0, PARITY_STEPS);
    console.log(`${run}: ${Math.round(s.stats.tokensPerSec)} tokens/s (${s.stats.adapter ?? s.stats.kernel})`);

    if (run === "cpu") {
      // A checkpoint downloaded from the page is sampled by alpha-native.
      const [download] = await Promise.all([page.waitForEvent("download"), page.locator("#download").click()]);
      const file = join(work, "from-page.safetensors");
      await download.saveAs(file);
      const out = execFileSync(native, ["sample", "--checkpoint", file, "--prompt", "ROMEO:", "--tokens", "50", "--seed", "1"], { encoding: "utf8" });
      assert.ok(out.startsWith("ROMEO:") && out.length >= 56, out);

      // A kept peak measured while the machine was busy (here a stale 1 GFLOP/s) is replaced
      // by Measure again, for this page and the next.
      assert.match(await page.locator("#peak").textContent(), new RegExp(`^MFU against ${Math.round(s.peak.gflops)} GFLOP/s`));
      const key = await page.evaluate(() => Object.keys(localStorage).find((k) => k.startsWith("alpha-peak:cpu")));
      await page.evaluate((k) => localStorage.setItem(k, "1"), key);
      await page.locator("#measure-peak").click();
      await page.waitForFunction(() => /^Peak measured again/.test(window.alpha.message));
      const again = await page.evaluate((k) => ({ kept: Number(localStorage.getItem(k)), peak: window.alpha.peak }), key);
      assert.ok(again.kept > 10 && again.kept === again.peak.gflops && again.peak.source === "measured", JSON.stringify(again));
      assert.match(await page.locator("#peak").textContent(), /measured now/);
    }
    await page.close();
  });
}

/** The losses of `steps` steps of `alpha-native train` with `flags`, checkpoint in work/`name`. */
function nativeLosses(flags, steps, name) {
  const metrics = join(work, `${name}.jsonl`);
  execFileSync(native, ["train", ...flags, "--iters", String(steps), "--log-interval", "1", "--eval-interval", "0", "--sample-interval", "0", "--out", join(work, name), "--metrics", metrics]);
  const losses = readFileSync(metrics, "utf8").trim().split("\n").map((l) => JSON.parse(l)).filter((r) => r.type === "train").map((r) => r.loss);
  assert.equal(losses.length, steps);
  return losses;
}

/** Asserts that the page's losses equal native's to `tolerance` relative (1e-4 unless
 * given), and logs the largest gap. */
function assertLossesMatch(what, got, want, tolerance = 1e-4) {
  const rel = got.map((loss, i) => Math.abs(loss - want[i]) / want[i]);
  console.log(`${what}: largest relative difference from alpha-native ${Math.max(...rel).toExponential(2)}`);
  rel.forEach((r, i) => assert.ok(r <= tolerance, `${what}, step ${i + 1}: page ${got[i]}, native ${want[i]} (relative ${r})`));
}

test(`the first ${PARITY_STEPS} steps' losses equal alpha-native's on the CPU (1e-4), and a native checkpoint loads into the page`, async () => {
  const want = nativeLosses(TINY, PARITY_STEPS, "native");
  for (const [run] of RUNS) {
    assert.ok(pageLosses[run], `the ${run} test ran first`);
    // f16 products (WebGPU with shader-f16) follow f32 within 2e-2.
    const tolerance = run === "webgpu" && webgpuPrecision === "f16" ? 2e-2 : 1e-4;
    assertLossesMatch(`${run}, ${PARITY_STEPS} steps`, pageLosses[run], want, tolerance);
  }
  const { page, errors } = await open("?backend=cpu&preset=tiny");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  await page.locator("#checkpoint").setInputFiles(join(work, "native", "ckpt.safetensors"));
  await page.waitForFunction(() => ["paused", "error"].includes(window.alpha?.status));
  const s = await page.evaluate(() => window.alpha);
  assert.equal(s.error, null);
  assert.equal(s.stats.step, PARITY_STEPS);
  assert.deepEqual(errors, []);
  await page.close();
});

// The Llama preset: RMSNorm, rotary attention over grouped heads, SwiGLU, on both backends.
// WebGPU (SwiftShader, many seconds a step on a slow machine) takes the first 3 steps, without
// evaluations or samples; the CPU the whole run (its first 10 steps native's), whose loss goes
// down.
const LLAMA_WEBGPU_STEPS = 3;
test(`the llama preset trains on WebGPU and on the CPU, its first steps alpha-native's`, async () => {
  const want = nativeLosses(["--config", "llama", "--lr", "3e-3", "--warmup", "10"], PARITY_STEPS, "native-llama");
  for (const [backend, steps, cadence] of [
    ["webgpu", LLAMA_WEBGPU_STEPS, "&evalInterval=0&sampleInterval=0"],
    ["cpu", STEPS, ""],
  ]) {
    const { page, errors } = await open(`?backend=${backend}&preset=llama&steps=${steps}&lr=3e-3&warmup=10${cadence}&autostart=1`);
    const s = await finished(page, 480_000);
    assert.equal(s.error, null);
    assert.equal(s.stats.backend, backend);
    assert.equal(s.losses.length, steps);
    if (steps === STEPS) assert.ok(mean(s.losses.slice(-5)) < mean(s.losses.slice(0, 5)) - 0.1, `${backend} losses: ${s.losses.join(", ")}`);
    const tolerance = backend === "webgpu" && webgpuPrecision === "f16" ? 2e-2 : 1e-4;
    const compared = Math.min(steps, PARITY_STEPS);
    assertLossesMatch(`llama on ${backend}, ${compared} steps`, s.losses.slice(0, compared), want, tolerance);
    assert.match(await page.locator("#preset option:checked").textContent(), /^llama: Llama, 2 key\/value heads, 4 layers/);
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test("BPE in the page: a tokenizer learned in WebAssembly trains and samples text, and an uploaded tokenizer.json gives alpha-native's losses", async () => {
  // Learned in the page from the Shakespeare text: 512 tokens.
  const learned = await open(`?backend=cpu&preset=tiny&steps=${STEPS}&tokenizer=512&autostart=1`);
  const s = await finished(learned.page);
  assert.equal(s.error, null);
  assert.deepEqual([s.stats.tokenizer, s.stats.vocab], ["bpe", 512]);
  assert.ok(mean(s.losses.slice(-5)) < mean(s.losses.slice(0, 5)) - 0.1, `losses: ${s.losses.join(", ")}`);
  const sample = await learned.page.locator("#samples pre").first().textContent();
  assert.ok(sample.length > 200, `200 BPE tokens are more than 200 characters: ${JSON.stringify(sample)}`);
  const [download] = await Promise.all([learned.page.waitForEvent("download"), learned.page.locator("#download").click()]);
  const file = join(work, "bpe-from-page.safetensors");
  await download.saveAs(file);
  const out = execFileSync(native, ["sample", "--checkpoint", file, "--prompt", "ROMEO:", "--tokens", "20", "--seed", "1"], { encoding: "utf8" });
  assert.ok(out.startsWith("ROMEO:") && out.length > 26, out);
  assert.deepEqual(learned.errors, []);
  await learned.page.close();

  // A tokenizer.json that alpha-native learned, uploaded: the page's first steps are native's.
  const tokenizer = join(work, "tokenizer.json");
  execFileSync(native, ["tokenizer", "train", "--data", join(www, "..", "data", "shakespeare.txt"), "--vocab-size", "400", "--out", tokenizer]);
  const want = nativeLosses([...TINY, "--tokenizer", tokenizer], PARITY_STEPS, "native-bpe");
  const uploaded = await open(`?backend=cpu&preset=tiny&steps=${STEPS}&tokenizer=json`);
  await uploaded.page.waitForFunction(() => window.alpha?.status === "idle");
  await uploaded.page.locator("#tokenizer-file").setInputFiles(tokenizer);
  await uploaded.page.locator("#start").click();
  const u = await finished(uploaded.page);
  assert.equal(u.error, null);
  assert.equal(u.stats.vocab, 400);
  assertLossesMatch(`uploaded tokenizer, ${PARITY_STEPS} steps`, u.losses.slice(0, PARITY_STEPS), want);
  assert.deepEqual(uploaded.errors, []);
  await uploaded.page.close();
});

test("the page's run loop is alpha-native train's: the same records (steps, losses, evaluations, samples, saves)", async () => {
  const cadence = { evalInterval: 4, sampleInterval: 6, checkpointInterval: 5, logInterval: 1 };
  const metrics = join(work, "loop.jsonl");
  const flags = Object.entries(cadence).flatMap(([k, v]) => [`--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`, String(v)]);
  execFileSync(native, ["train", "--config", "tiny", "--iters", "12", ...flags, "--out", join(work, "loop"), "--metrics", metrics]);
  const cli = readFileSync(metrics, "utf8").trim().split("\n").map((l) => JSON.parse(l)).filter((r) => r.type !== "start");
  const query = Object.entries(cadence).map(([k, v]) => `&${k}=${v}`).join("");
  const { page, errors } = await open(`?backend=cpu&preset=tiny&steps=12${query}&autostart=1`);
  const s = await finished(page);
  assert.equal(s.error, null);
  const kinds = (records) => records.map((r) => `${r.type}@${r.step}`);
  assert.deepEqual(kinds(s.records), kinds(cli));
  assert.ok(kinds(cli).includes("save@5") && kinds(cli).includes("sample@6") && kinds(cli).includes("eval@12"), kinds(cli).join(" "));
  const close = (what, got, want) => assert.ok(Math.abs(got - want) <= 1e-4 * want, `${what}: page ${got}, native ${want}`);
  s.records.forEach((r, i) => {
    const c = cli[i];
    if (r.type === "train") close(`loss of step ${r.step}`, r.loss, c.loss);
    if (r.type === "eval") {
      close(`train loss at ${r.step}`, r.train, c.train_loss);
      close(`val loss at ${r.step}`, r.val, c.val_loss);
    }
    if (r.type === "sample") assert.equal(r.text.length, c.text.length);
  });
  assert.equal(s.saved, 12);
  assert.deepEqual(errors, []);
  await page.close();
});

// The speed of the threads is a benchmark, not a test: `node www/bench.mjs 3 small`.
test("the page's CPU engine on every core (the threads build): two threads give one thread's losses", async () => {
  const losses = {};
  for (const threads of [1, 2]) {
    const { page, errors } = await open(`?backend=cpu&preset=small&steps=6&threads=${threads}&evalInterval=0&sampleInterval=0&autostart=1`);
    const s = await finished(page);
    assert.equal(s.error, null);
    assert.equal(s.stats.threads, threads);
    assert.equal(s.stats.kernel, "wasm-relaxed-simd");
    assert.deepEqual(errors, []);
    losses[threads] = s.losses;
    await page.close();
  }
  assert.equal(losses[2].length, 6);
  assert.deepEqual(losses[2], losses[1], "two threads changed the losses");
});

/** Uploads checkpoint `file` into a fresh page at `query`, presses Resume, and returns the state when done. */
async function resumeInPage(file, query) {
  const { page, errors } = await open(query);
  await page.waitForFunction(() => window.alpha?.status === "idle");
  await page.locator("#checkpoint").setInputFiles(file);
  await page.waitForFunction(() => ["paused", "error"].includes(window.alpha?.status));
  const loaded = await page.evaluate(() => window.alpha);
  assert.equal(loaded.error, null);
  assert.equal(await page.locator("#start").textContent(), "Resume");
  await page.click("#start");
  const s = await finished(page);
  assert.equal(s.error, null);
  const chart = await page.locator("#chart").evaluate((c) => ({ ...c.dataset }));
  assert.deepEqual(errors, []);
  return { page, loaded, s, chart };
}

test("a finished run's checkpoint, native or the page's, resumes in the page: the steps and the chart continue", async () => {
  // alpha-native's 10-step run (the parity test's) and the page's own 30-step download: both
  // runs are finished, so the page trains another preset's length (300 steps) after them.
  for (const [file, query, from] of [
    [join(work, "native", "ckpt.safetensors"), "?backend=cpu&preset=tiny", PARITY_STEPS],
    [join(work, "from-page.safetensors"), `?backend=cpu&preset=tiny&steps=${STEPS}`, STEPS],
  ]) {
    const { page, loaded, s, chart } = await resumeInPage(file, query);
    assert.equal(loaded.stats.step, from);
    assert.equal(s.stats.step, from + 300, file);
    assert.equal(await page.locator("#step").textContent(), String(from + 300));
    assert.equal(s.firstStep, from);
    assert.equal(s.losses.length, 300);
    // The loss line starts at the checkpoint's step, on the run's own axis.
    assert.deepEqual([chart.firstStep, chart.lastStep, chart.xMax], [String(from), String(from + 300), String(from + 300)]);
    assert.ok(s.evals.every((e) => e.step >= from) && s.evals.at(-1).step === from + 300, JSON.stringify(s.evals));
    await page.screenshot({ path: join(results, `resumed-from-${from}.png`), fullPage: true });
    await page.close();
  }
});

test("a Hugging Face Llama directory's files load through Trainer.loadHuggingFace: greedy tokens are alpha-native's, on the CPU and WebGPU", async () => {
  const dir = join(www, "..", "tests", "data", "llama-fixture");
  const want = execFileSync(native, ["sample", "--checkpoint", dir, "--prompt", "ROMEO:", "--tokens", "12", "--temperature", "0"], { encoding: "utf8" });
  const files = {
    config: readFileSync(join(dir, "config.json"), "utf8"),
    tokenizer: readFileSync(join(dir, "tokenizer.json"), "utf8"),
    weights: [...readFileSync(join(dir, "model.safetensors"))],
    text: readFileSync(join(dir, "text.txt"), "utf8"),
  };
  for (const backend of ["cpu", "webgpu"]) {
    const { page, errors } = await open(`?backend=${backend}&preset=tiny`);
    await page.waitForFunction(() => window.alpha?.status === "idle");
    const got = await page.evaluate(async ([files, backend]) => {
      const { Trainer } = await import("./main.js");
      const t = await Trainer.loadHuggingFace(files.config, files.tokenizer, new Uint8Array(files.weights), files.text, { backend });
      const stats = t.stats();
      return { text: await t.sample("ROMEO:", 12, 0), backend: stats.backend, precision: stats.precision };
    }, [files, backend]);
    assert.equal(got.backend, backend);
    // f16 products (WebGPU with shader-f16) may pick other greedy tokens.
    if (got.precision === "f32") assert.equal(`ROMEO:${got.text}\n`, want);
    else assert.ok(got.text.length > 0);
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test("Generate: greedy tokens are alpha-native sample's, they stream as they come, Stop stops them, a bad setting is a message", async () => {
  nativeLosses(TINY, PARITY_STEPS, "native-generate");
  const checkpoint = join(work, "native-generate", "ckpt.safetensors");
  const want = execFileSync(native, ["sample", "--checkpoint", checkpoint, "--prompt", "ROMEO:", "--tokens", "60", "--temperature", "0"], { encoding: "utf8" });
  for (const backend of ["cpu", "webgpu"]) {
    const { page, errors } = await open(`?backend=${backend}&preset=tiny`);
    await page.waitForFunction(() => window.alpha?.status === "idle");
    assert.ok(await page.locator("#generate").isDisabled(), "nothing to generate from before a model exists");
    await page.locator("#checkpoint").setInputFiles(checkpoint);
    await page.waitForFunction(() => ["paused", "error"].includes(window.alpha?.status));
    // Token by token on SwiftShader: seconds on a slow machine, beyond the default 30 s wait.
    const generated = async () => {
      await page.waitForFunction(() => window.alpha.generation.status === "idle", null, { timeout: 180_000 });
      return page.evaluate(() => window.alpha.generation.text);
    };
    await page.fill("#prompt", "ROMEO:");
    await page.fill("#gen-tokens", "60");
    await page.fill("#gen-temperature", "0");
    await page.click("#generate");
    const greedy = await generated();
    const precision = await page.evaluate(() => window.alpha.stats.precision);
    // f16 products (WebGPU with shader-f16) may pick other greedy tokens.
    if (precision === "f32") assert.equal(`${greedy}\n`, want, backend);
    assert.equal(await page.locator("#generated").textContent(), greedy);

    // A long generation shows its text while it runs; Stop ends it.
    await page.fill("#gen-tokens", "100000");
    await page.fill("#gen-temperature", "0.8");
    await page.fill("#gen-top-k", "20");
    await page.fill("#gen-top-p", "0.9");
    await page.click("#generate");
    await page.waitForFunction(() => window.alpha.generation.status === "running" && window.alpha.generation.text.length > 40, null, { timeout: 180_000 });
    assert.ok(await page.locator("#generate").isDisabled());
    await page.click("#stop");
    const stopped = await generated();
    assert.ok(stopped.startsWith("ROMEO:") && stopped.length > 40 && stopped.length < 20_000, `${stopped.length} characters`);

    await page.fill("#gen-top-p", "0");
    await page.click("#generate");
    await generated();
    assert.match(await page.locator("#message").textContent(), /topP must be above 0 and at most 1/);
    assert.equal(await page.evaluate(() => window.alpha.status), "paused", "a bad setting leaves the model as it was");
    assert.deepEqual(errors, []);
    await page.close();
  }
});

test("build-web.sh --dist: the folder serves as it is; with its _headers the CPU trains on every core, without them on one thread and the page says so", async () => {
  const dist = process.env.ALPHA_WEB_DIST;
  assert.ok(dist, "set ALPHA_WEB_DIST to a folder scripts/build-web.sh --dist wrote (scripts/test.sh does)");
  assert.match(readFileSync(join(dist, "_headers"), "utf8"), /Cross-Origin-Opener-Policy: same-origin\n\s*Cross-Origin-Embedder-Policy: require-corp/);
  for (const isolation of [true, false]) {
    const server = await startServer([dist, ...(isolation ? [] : ["--no-isolation"])]);
    const page = await newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`${server.base}?backend=cpu&preset=tiny&steps=5&autostart=1`);
    const s = await finished(page);
    assert.equal(s.error, null);
    assert.equal(s.wasmBuild === "threads", isolation, s.wasmBuild);
    assert.equal(s.stats.threads > 1, isolation, `${s.stats.threads} threads`);
    assert.equal(await page.locator("#isolation").isVisible(), !isolation);
    assert.deepEqual(errors, []);
    await page.close();
    server.stop();
  }
});

test("a Hugging Face model picked in the page: it generates alpha-native's greedy tokens, fine-tunes, and downloads as a directory alpha-native and transformers' layout read", async () => {
  const dir = join(www, "..", "tests", "data", "llama-fixture");
  const greedy = (model) => execFileSync(native, ["sample", "--checkpoint", model, "--prompt", "ROMEO:", "--tokens", "12", "--temperature", "0"], { encoding: "utf8" });
  const want = greedy(dir);
  const { page, errors } = await open("?backend=cpu&preset=tiny&steps=3");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  // Files missing: one line naming them.
  await page.locator("#hf-files").setInputFiles([join(dir, "config.json")]);
  await page.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await page.locator("#message").textContent(), /missing: tokenizer\.json, model\.safetensors/);
  await page.selectOption("#corpus", "paste");
  await page.fill("#paste", readFileSync(join(dir, "text.txt"), "utf8"));
  await page.locator("#hf-files").setInputFiles(["config.json", "tokenizer.json", "model.safetensors"].map((f) => join(dir, f)));
  await page.waitForFunction(() => window.alpha?.status === "paused");
  await page.fill("#gen-tokens", "12");
  await page.fill("#gen-temperature", "0");
  await page.click("#generate");
  await page.waitForFunction(() => window.alpha.generation.status === "idle");
  assert.equal(`${await page.evaluate(() => window.alpha.generation.text)}\n`, want);

  // Downloaded as a zip of the directory: the same model to alpha-native.
  const unzipped = (name) => {
    const out = join(work, name);
    execFileSync("python3", ["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])", join(work, `${name}.zip`), out]);
    return out;
  };
  const download = async (name) => {
    const [file] = await Promise.all([page.waitForEvent("download"), page.locator("#export-hf").click()]);
    await file.saveAs(join(work, `${name}.zip`));
    return unzipped(name);
  };
  const exported = await download("hf-from-page");
  assert.equal(greedy(exported), want);
  // Fine-tuned in the page (3 steps), then downloaded: alpha-native reads it.
  await page.click("#start");
  const s = await finished(page);
  assert.equal(s.error, null);
  assert.equal(s.losses.length, 3);
  const tuned = await download("hf-tuned-in-page");
  const evaluated = JSON.parse(execFileSync(native, ["eval", "--checkpoint", tuned, "--text", join(dir, "text.txt")], { encoding: "utf8" }));
  assert.ok(evaluated.loss > 0 && Number.isFinite(evaluated.loss), JSON.stringify(evaluated));
  assert.deepEqual(errors, []);
  await page.close();
});

test("Settings: edited before Start, with the memory the plan needs shown first; the run is the settings' and a model that cannot run says why", async () => {
  const { page, errors } = await open("?backend=cpu&preset=tiny&steps=3");
  await page.waitForFunction(() => window.alpha?.status === "idle" && window.alpha.memory !== null);
  const before = await page.evaluate(() => window.alpha.memory);
  await page.click("#settings summary");
  assert.equal(await page.locator("#set-layers").inputValue(), "2");
  assert.ok(await page.locator("#set-kvHeads").isHidden(), "Llama's settings only for the Llama family");
  await page.selectOption("#set-arch", "llama");
  assert.ok(await page.locator("#set-kvHeads").isVisible());
  await page.fill("#set-layers", "3");
  await page.locator("#set-layers").dispatchEvent("change");
  await page.waitForFunction((p) => window.alpha.memory?.params !== p, before.params);
  const planned = await page.evaluate(() => window.alpha.memory);
  assert.match(await page.locator("#memory").textContent(), new RegExp(`^${planned.params.toLocaleString("en")} parameters .* MiB of memory`));
  await page.click("#start");
  const s = await finished(page);
  assert.equal(s.error, null);
  assert.equal(s.stats.params, planned.params);
  assert.equal(s.stats.config.n_layer, 3);
  assert.equal(s.stats.config.arch?.type, "llama", JSON.stringify(s.stats.config));
  // Heads that do not divide the width: said before Start.
  await page.fill("#set-heads", "5");
  await page.locator("#set-heads").dispatchEvent("change");
  await page.waitForFunction(() => window.alpha.memory === null);
  assert.match(await page.locator("#memory").textContent(), /^These settings will not run: .*5/);
  assert.deepEqual(errors, []);
  await page.close();
});

test("Runs kept: a finished run is offered after a reload, opens at its step, downloads and deletes; a save the storage quota refuses is said and the run goes on", async () => {
  const { page, errors } = await open("?backend=cpu&preset=tiny&steps=12&autostart=1");
  const s = await finished(page);
  assert.equal(s.error, null);
  await page.waitForFunction(() => window.alpha.kept.length === 1 && window.alpha.kept[0].step === 12);
  // The page again (a reload, without starting a run).
  await page.goto(`${base}?backend=cpu&preset=tiny`);
  await page.waitForFunction(() => window.alpha?.status === "idle" && window.alpha.kept.length === 1);
  assert.match(await page.locator("#runs-offer").textContent(), /^Your last run, tiny, .* \(step 12 of 12\), is kept in this browser/);
  await page.locator('#runs button[data-action="open"]').click();
  await page.waitForFunction(() => ["paused", "error"].includes(window.alpha.status));
  const opened = await page.evaluate(() => window.alpha);
  assert.equal(opened.error, null);
  assert.equal(opened.stats.step, 12);
  const [download] = await Promise.all([page.waitForEvent("download"), page.locator('#runs button[data-action="download"]').click()]);
  const file = join(work, "kept-run.safetensors");
  await download.saveAs(file);
  const out = execFileSync(native, ["sample", "--checkpoint", file, "--prompt", "ROMEO:", "--tokens", "10", "--seed", "1"], { encoding: "utf8" });
  assert.ok(out.startsWith("ROMEO:"), out);
  await page.locator('#runs button[data-action="delete"]').click();
  await page.waitForFunction(() => window.alpha.kept.length === 0);
  assert.ok(await page.locator("#runs-section").isHidden());
  assert.deepEqual(errors, []);
  await page.close();

  // Storage that refuses every save (a full quota): said in one line, the run finishes.
  const context = await newContext();
  await context.addInitScript(() => {
    IDBObjectStore.prototype.put = () => {
      throw new DOMException("the quota is full", "QuotaExceededError");
    };
  });
  const full = await context.newPage();
  await full.goto(`${base}?backend=cpu&preset=tiny&steps=5&autostart=1`);
  const f = await finished(full);
  assert.equal(f.error, null);
  await full.waitForFunction(() => /storage quota refused to keep this run/.test(window.alpha.message));
  assert.equal(f.stats.step, 5);
  await context.close();
});

test("at a phone's width (390 x 844) the page fits: no sideways scrolling, every control inside the screen", async () => {
  const context = await newContext({ viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
  const page = await context.newPage();
  await page.goto(`${base}?backend=cpu&preset=shakespeare_char&steps=3&autostart=1`);
  // Trained a little, so that the figures, the charts, a sample and the kept run are filled;
  // then text generated, the settings opened and the paste box shown too.
  const s = await finished(page);
  assert.equal(s.error, null);
  await page.waitForFunction(() => window.alpha.kept.length > 0);
  await page.fill("#gen-tokens", "20");
  await page.locator("#generate").click();
  await page.waitForFunction(() => window.alpha.generation.status === "idle" && window.alpha.generation.text.length > 0);
  await page.selectOption("#preset", "shakespeare_char");
  await page.locator("#settings summary").click();
  await page.selectOption("#corpus", "paste");
  const layout = await page.evaluate(() => {
    const controls = [...document.querySelectorAll("select, button, input, textarea, label, canvas, dd, pre, #message")];
    const visible = controls.filter((e) => e.getClientRects().length > 0);
    return {
      viewport: window.innerWidth,
      scrollWidth: document.documentElement.scrollWidth,
      outside: visible
        .map((e) => ({ e: e.id || e.tagName.toLowerCase(), r: e.getBoundingClientRect() }))
        .filter(({ r }) => r.left < 0 || r.right > window.innerWidth + 0.5)
        .map(({ e, r }) => `${e}: ${Math.round(r.left)}..${Math.round(r.right)}`),
      counted: visible.length,
      options: document.querySelectorAll("#preset option").length,
    };
  });
  await page.screenshot({ path: join(results, "phone-390.png"), fullPage: true });
  assert.equal(layout.viewport, 390);
  assert.ok(layout.options >= 3 && layout.counted >= 40, JSON.stringify(layout));
  assert.ok(layout.scrollWidth <= layout.viewport, `the document is ${layout.scrollWidth} px wide on a ${layout.viewport} px screen`);
  assert.deepEqual(layout.outside, []);
  await context.close();
});

// Shapes where no GEMM is a whole number of tiles of any kernel (39 rows, widths 36, 108,
// 144 and 84, attention over 13 positions with heads of 12), so every edge path runs; with
// dropout, whose masks the page draws as alpha-native does.
const ODD = { layers: 1, heads: 3, embd: 36, block: 13, batch: 3, lr: 3e-3, warmup: 10, dropout: 0.2 };
const ODD_STEPS = 3;

test(`odd shapes with dropout: the first ${ODD_STEPS} steps' losses equal alpha-native's (1e-4) on WebGPU and both CPU builds`, async () => {
  const flags = Object.entries(ODD).flatMap(([k, v]) => [`--${k}`, String(v)]);
  const want = nativeLosses(flags, ODD_STEPS, "odd");
  const { page, errors } = await open();
  await page.waitForFunction(() => window.alpha?.status === "idle");
  for (const [build, backend] of [["relaxed", "cpu"], ["simd128", "cpu"], ["simd128", "webgpu"]]) {
    const losses = await page.evaluate(async ({ build, backend, options, steps }) => {
      const { WASM_BUILDS } = await import("./main.js");
      const { default: init, Trainer } = await import(WASM_BUILDS[build]);
      await init();
      const text = await (await fetch("data/shakespeare.txt")).text();
      const t = await Trainer.create({ ...options, backend }, text);
      return Array.from(await t.step(steps));
    }, { build, backend, options: ODD, steps: ODD_STEPS });
    const tolerance = backend === "webgpu" && webgpuPrecision === "f16" ? 2e-2 : 1e-4;
    assertLossesMatch(`odd shapes, ${backend} (${build})`, losses, want, tolerance);
  }
  assert.deepEqual(errors, []);
  await page.close();
});

test("a model that is not finite is never saved, on WebGPU and the CPU", async () => {
  const { page, errors } = await open("?backend=cpu&preset=tiny");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  for (const backend of ["cpu", "webgpu"]) {
    const result = await page.evaluate(async (backend) => {
      const { WASM_BUILDS } = await import("./main.js");
      const { default: init, Trainer } = await import(WASM_BUILDS.simd128);
      await init();
      const text = await (await fetch("data/shakespeare.txt")).text();
      // A learning rate past f32's range: the first update makes the weights infinite while
      // its loss, computed before it, is finite.
      const t = await Trainer.create({ layers: 1, heads: 2, embd: 16, block: 16, batch: 4, lr: 1e39, warmup: 0, backend }, text);
      const [loss] = await t.step(1);
      try {
        await t.save();
        return { loss, saved: true };
      } catch (e) {
        return { loss, saved: false, message: String(e.message ?? e) };
      }
    }, backend);
    assert.ok(Number.isFinite(result.loss), JSON.stringify(result));
    assert.equal(result.saved, false, `${backend}: a non-finite model was saved`);
    assert.match(result.message, /^not saving step 1: the model is not finite \(transformer\./);
  }
  assert.deepEqual(errors, []);
  await page.close();
});

test("clear messages: a text too short, no WebGPU asked for where there is none, a model beyond the page's memory", async () => {
  const { page } = await open("?backend=cpu&preset=tiny");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  await page.selectOption("#corpus", "paste");
  await page.fill("#paste", "far too short");
  await page.click("#start");
  await page.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await page.locator("#message").textContent(), /the text is too short: 13 tokens/);
  await page.close();
  const context = await newContext();
  await context.addInitScript(() => delete Object.getPrototypeOf(navigator).gpu);
  const noGpu = await context.newPage();
  await noGpu.goto(`${base}?backend=webgpu&preset=tiny&autostart=1`);
  await noGpu.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await noGpu.locator("#message").textContent(), /this browser has no WebGPU/);
  await context.close();
  // 176 million parameters: past what WebAssembly's 32-bit memory holds, refused before
  // anything is allocated.
  const big = await open("?backend=cpu&preset=tiny&layers=14&heads=16&embd=1024&block=64&autostart=1");
  await big.page.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await big.page.locator("#message").textContent(), /the model's memory plan needs about \d+ bytes, more than this machine's address space holds/);
  assert.deepEqual(big.errors, []);
  await big.page.close();
});

// `alpha-native report` of two real short runs, the CPU in f32 (metrics and trace) against the
// GPU in f16 (with the loss scale), opened from disk: no console errors, every chart drawn with
// the runs' number of points, at a desk's and a phone's width.
test("alpha-native report: two runs' charts from disk, at a desk's and a phone's width", async () => {
  const metrics = join(work, "report-run.jsonl");
  const f16Metrics = join(work, "report-f16.jsonl");
  const trace = join(work, "report-run.trace.json");
  const out = join(work, "report.html");
  const flags = [...TINY, "--iters", "24", "--log-interval", "2", "--eval-interval", "8", "--eval-iters", "2", "--sample-interval", "12"];
  execFileSync(native, ["train", ...flags, "--out", join(work, "report-run"), "--metrics", metrics, "--trace", trace, "--trace-steps", "3"]);
  execFileSync(native, ["train", ...flags, "--out", join(work, "report-f16"), "--metrics", f16Metrics, "--backend", "gpu", "--precision", "f16"]);
  execFileSync(native, ["report", "--metrics", metrics, "--metrics", f16Metrics, "--trace", trace, "--out", out]);
  const records = [metrics, f16Metrics].flatMap((m) => readFileSync(m, "utf8").trim().split("\n").map((l) => JSON.parse(l)));
  const count = (type) => records.filter((r) => r.type === type).length;
  const [train, evals] = [count("train") / 2, count("eval") / 2];
  assert.ok(train >= 12 && evals === 4, `${train} train and ${evals} eval records per run`);
  const want = {
    "chart-loss-step": 2 * (train + evals), "chart-loss-time": 2 * (train + evals), "chart-lr": 2 * train, "chart-grad-norm": 2 * (train + 2),
    "chart-tokens": 2 * train, "chart-mfu": 4 * train, "chart-loss-scale": train, "chart-skipped": train, "chart-phases": 2,
  };
  for (const [name, width] of [["desk", 1000], ["phone", 390]]) {
    const page = await newPage({ viewport: { width, height: 800 } });
    const errors = [];
    page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    page.on("pageerror", (e) => errors.push(String(e)));
    // Nothing outside the file: every request but the page itself would be a network one.
    const requests = [];
    page.on("request", (r) => requests.push(r.url()));
    await page.goto(`file://${out}`);
    await page.waitForSelector("#chart-phases");
    const drawn = Object.fromEntries(await page.$$eval("canvas", (cs) => cs.map((c) => [c.id, Number(c.dataset.points)])));
    assert.deepEqual(drawn, want, name);
    assert.equal(await page.locator("#top-ops tr").count() > 5, true);
    assert.equal(await page.locator("details.sample").count(), count("sample"));
    assert.ok(await page.evaluate(() => document.scrollingElement.scrollWidth <= window.innerWidth), `${name}: wider than the screen`);
    await page.locator("#log-scale").check();
    assert.equal(Number(await page.locator("#chart-loss-step").getAttribute("data-points")), 2 * (train + evals));
    assert.deepEqual(errors, []);
    assert.deepEqual(requests, [`file://${out}`]);
    await page.screenshot({ path: join(results, `report-${name}.png`), fullPage: true });
    await page.close();
  }
});

// `train --serve`: the live dashboard during a run: the page's step count grows as it trains,
// with no console errors, at a phone's width too.
test("train --serve: the live dashboard's steps grow while the run trains", async () => {
  const run = spawn(native, ["train", ...TINY, "--threads", "1", "--iters", "1000000", "--log-interval", "20", "--eval-interval", "0", "--sample-interval", "0",
    "--out", join(work, "live"), "--serve", "127.0.0.1:0"], { stdio: ["ignore", "pipe", "inherit"] });
  try {
    const url = await new Promise((resolve, reject) => {
      run.stdout.once("data", (d) => resolve(String(d).match(/dashboard: (http:\/\/\S+)/)[1]));
      run.once("exit", (code) => reject(new Error(`alpha-native train --serve exited with ${code}`)));
    });
    run.stdout.resume(); // the run's plain lines, read away
    for (const width of [1000, 390]) {
      const page = await newPage({ viewport: { width, height: 800 } });
      const errors = [];
      page.on("console", (m) => m.type() === "error" && errors.push(m.text()));
      page.on("pageerror", (e) => errors.push(String(e)));
      await page.goto(url);
      const steps = () => page.locator("#report").getAttribute("data-steps").then(Number);
      await page.waitForFunction(() => Number(document.getElementById("report").dataset.steps) >= 0);
      const first = await steps();
      await page.waitForFunction((n) => Number(document.getElementById("report").dataset.steps) > n, first);
      assert.ok(Number(await page.locator("#chart-loss-step").getAttribute("data-points")) > 1);
      assert.ok(await page.evaluate(() => document.scrollingElement.scrollWidth <= window.innerWidth), `${width} px: wider than the screen`);
      assert.deepEqual(errors, []);
      await page.screenshot({ path: join(results, `live-${width}.png`), fullPage: true });
      await page.close();
    }
  } finally {
    run.kill();
  }
});
