// The demo in a real browser: Debian's Chromium (never a downloaded one) driven by
// playwright-core, WebGPU on SwiftShader. Needs `wasm-pack build` into www/pkg and the
// alpha-native binary in $ALPHA_NATIVE (scripts/test.sh provides both). Screenshots go to
// www/test-results/.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { finished, launchChromium, startServer } from "../browser.mjs";

const www = fileURLToPath(new URL("..", import.meta.url));
const results = join(www, "test-results");
const native = process.env.ALPHA_NATIVE;
const work = mkdtempSync(join(tmpdir(), "alpha-www-"));
mkdirSync(results, { recursive: true });

// The tiny preset's model, as alpha-native flags.
const TINY = ["--layers", "2", "--heads", "2", "--embd", "32", "--block", "32", "--batch", "8", "--lr", "3e-3", "--warmup", "10"];
const STEPS = 30;

let server;
let base;
let browser;
const firstLoss = {};

before(async () => {
  assert.ok(native, "set ALPHA_NATIVE to the alpha-native binary (scripts/test.sh does)");
  server = await startServer();
  base = server.base;
  browser = await launchChromium();
});

after(async () => {
  await browser?.close();
  server?.stop();
});

/** A page at `query` whose console errors and uncaught exceptions are collected. */
async function open(query = "") {
  const page = await browser.newPage({ acceptDownloads: true });
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

for (const [backend, shown] of [["webgpu", /^WebGPU \(/], ["cpu", /^CPU \(WebAssembly\)$/]]) {
  test(`${backend}: ${STEPS} steps of the tiny preset, the loss goes down, chart and sample appear`, async () => {
    const { page, errors } = await open(`?backend=${backend}&preset=tiny&steps=${STEPS}&autostart=1`);
    const s = await finished(page);
    assert.equal(s.error, null);
    assert.equal(s.stats.backend, backend);
    assert.equal(s.losses.length, STEPS);
    assert.ok(mean(s.losses.slice(-5)) < mean(s.losses.slice(0, 5)) - 0.1, `losses: ${s.losses.join(", ")}`);
    assert.deepEqual(s.evals.map((e) => e.step), [0, 25, STEPS]);
    assert.ok(s.evals.at(-1).val < s.evals[0].val, JSON.stringify(s.evals));
    assert.match(await page.locator("#backend-name").textContent(), shown);
    assert.equal(await page.locator("#step").textContent(), String(STEPS));
    assert.ok(Number(await page.locator("#chart").getAttribute("data-points")) >= STEPS + 3);
    const sample = await page.locator("#samples pre").first().textContent();
    assert.equal(sample.length, 200);
    assert.ok(Number((await page.locator("#tok-s").textContent()).replace(/,/g, "")) > 0);
    await page.screenshot({ path: join(results, `training-${backend}.png`), fullPage: true });
    assert.deepEqual(errors, []);
    firstLoss[backend] = s.losses[0];
    console.log(`${backend}: ${Math.round(s.stats.tokensPerSec)} tokens/s (${s.stats.adapter ?? "wasm"})`);

    if (backend === "cpu") {
      // A checkpoint downloaded from the page is sampled by alpha-native.
      const [download] = await Promise.all([page.waitForEvent("download"), page.locator("#download").click()]);
      const file = join(work, "from-page.safetensors");
      await download.saveAs(file);
      const out = execFileSync(native, ["sample", "--checkpoint", file, "--prompt", "ROMEO:", "--tokens", "50", "--seed", "1"], { encoding: "utf8" });
      assert.ok(out.startsWith("ROMEO:") && out.length >= 56, out);
    }
    await page.close();
  });
}

test("the first step's loss equals alpha-native's on the CPU (1e-4), and a native checkpoint loads into the page", async () => {
  execFileSync(native, ["train", ...TINY, "--iters", "1", "--log-interval", "1", "--eval-interval", "0", "--sample-interval", "0", "--out", join(work, "native"), "--metrics", join(work, "m.jsonl")]);
  const record = readFileSync(join(work, "m.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l)).find((r) => r.type === "train");
  for (const backend of ["webgpu", "cpu"]) {
    assert.ok(firstLoss[backend], `the ${backend} test ran first`);
    const rel = Math.abs(firstLoss[backend] - record.loss) / record.loss;
    assert.ok(rel <= 1e-4, `${backend}: page ${firstLoss[backend]}, native ${record.loss} (relative ${rel})`);
  }
  const { page, errors } = await open("?backend=cpu&preset=tiny");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  await page.locator("#checkpoint").setInputFiles(join(work, "native", "ckpt.safetensors"));
  await page.waitForFunction(() => ["paused", "error"].includes(window.alpha?.status));
  const s = await page.evaluate(() => window.alpha);
  assert.equal(s.error, null);
  assert.equal(s.stats.step, 1);
  assert.deepEqual(errors, []);
  await page.close();
});

test("clear messages: a text too short, no WebGPU asked for where there is none", async () => {
  const { page } = await open("?backend=cpu&preset=tiny");
  await page.waitForFunction(() => window.alpha?.status === "idle");
  await page.selectOption("#corpus", "paste");
  await page.fill("#paste", "far too short");
  await page.click("#start");
  await page.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await page.locator("#message").textContent(), /the text is too short: 13 characters/);
  await page.close();
  const context = await browser.newContext();
  await context.addInitScript(() => delete Object.getPrototypeOf(navigator).gpu);
  const noGpu = await context.newPage();
  await noGpu.goto(`${base}?backend=webgpu&preset=tiny&autostart=1`);
  await noGpu.waitForFunction(() => window.alpha?.status === "error");
  assert.match(await noGpu.locator("#message").textContent(), /this browser has no WebGPU/);
  await context.close();
});
