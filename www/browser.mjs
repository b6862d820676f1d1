// Shared by the browser tests and the benchmark: the demo server and Debian's Chromium with
// WebGPU on SwiftShader (the flags below; never a downloaded browser).

import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

/** Starts serve.mjs on a free port with `args` (a folder to serve, `--no-isolation`);
 * resolves to `{ base, stop }`. */
export async function startServer(args = []) {
  const server = spawn(process.execPath, [fileURLToPath(new URL("serve.mjs", import.meta.url)), ...args], {
    env: { ...process.env, PORT: "0" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const base = await new Promise((resolve, reject) => {
    server.stdout.once("data", (d) => resolve(String(d).match(/http:\/\/\S+/)[0]));
    server.once("exit", (code) => reject(new Error(`the demo server exited with ${code}`)));
  });
  return { base, stop: () => server.kill() };
}

/** Launches headless Chromium (`$CHROMIUM`, default /usr/bin/chromium) with WebGPU. */
export function launchChromium() {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: false,
    args: [
      "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--enable-features=Vulkan",
      "--use-webgpu-adapter=swiftshader", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
    ],
  });
}

/** Waits until the page's training has finished (or failed) and returns its state. */
export async function finished(page, timeout = 240_000) {
  await page.waitForFunction(() => ["done", "error"].includes(window.alpha?.status), null, { timeout, polling: 250 });
  return page.evaluate(() => window.alpha);
}
