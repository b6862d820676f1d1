// Tokens/s of the tiny preset in one run: in the page (WebGPU on SwiftShader, the CPU in
// WebAssembly) and natively (`alpha-native bench`: CPU on 1 thread, GPU on the default
// adapter, lavapipe without a GPU). Page figures count step() time only, as bench does.
//   node www/bench.mjs [rounds]   (after `cargo build --release`; ALPHA_NATIVE=path overrides
//   the workspace's target/release/alpha-native)

import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { finished, launchChromium, startServer } from "./browser.mjs";

const native = process.env.ALPHA_NATIVE ?? fileURLToPath(new URL("../target/release/alpha-native", import.meta.url));
if (!existsSync(native)) throw new Error(`${native} not found: run \`cargo build --release\` first, or set ALPHA_NATIVE`);
const rounds = Number(process.argv[2] ?? 3);
// Mesa (lavapipe) wants a private runtime directory, as in scripts/test.sh.
const env = { ...process.env, XDG_RUNTIME_DIR: process.env.XDG_RUNTIME_DIR ?? mkdtempSync(join(tmpdir(), "alpha-xdg-")) };
const MODEL = ["--layers", "2", "--heads", "2", "--embd", "32", "--block", "32", "--batch", "8"];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const server = await startServer();
const browser = await launchChromium();
const runs = { "page, WebGPU (SwiftShader)": [], "page, CPU (WebAssembly)": [], "native CPU, 1 thread": [], "native GPU (lavapipe)": [] };
for (let r = 0; r < rounds; r++) {
  for (const [name, backend, steps] of [["page, WebGPU (SwiftShader)", "webgpu", 40], ["page, CPU (WebAssembly)", "cpu", 200]]) {
    const page = await browser.newPage();
    await page.goto(`${server.base}?backend=${backend}&preset=tiny&steps=${steps}&autostart=1`);
    const s = await finished(page, 600_000);
    if (s.error) throw new Error(`${name}: ${s.error}`);
    runs[name].push((s.trainedSteps * s.stats.tokensPerStep) / (s.trainMs / 1e3));
    await page.close();
  }
  for (const [name, extra] of [["native CPU, 1 thread", ["--threads", "1", "--iters", "200"]], ["native GPU (lavapipe)", ["--backend", "gpu", "--iters", "40"]]]) {
    const out = execFileSync(native, ["bench", ...MODEL, ...extra, "--warmup", "5", "--json", "--peak-gflops", "1"], { encoding: "utf8", env });
    runs[name].push(JSON.parse(out).tokens_per_sec);
  }
}
await browser.close();
server.stop();
console.log(`tiny preset (2 layers, 32 wide, block 32, batch 8: 256 tokens/step), median of ${rounds} rounds`);
for (const [name, xs] of Object.entries(runs)) {
  console.log(`${name.padEnd(28)} ${Math.round(median(xs)).toString().padStart(8)} tokens/s   (${xs.map(Math.round).join(", ")})`);
}
const ratio = median(runs["page, CPU (WebAssembly)"]) / median(runs["native CPU, 1 thread"]);
console.log(`wasm CPU / native CPU (1 thread): ${ratio.toFixed(2)}x`);
