// A static server for the demo: www/ at /, the repository's data/ at /data/ (the Shakespeare
// corpus), cross-origin isolated (so the page can use WebAssembly threads). No dependencies.
// `npm start` (port 8080) or `PORT=0 node serve.mjs` (any free port); it prints the address it
// listens on. `node serve.mjs DIR` serves a folder `scripts/build-web.sh --dist DIR` wrote
// instead; `--no-isolation` leaves the isolation headers out (as a host without them would).

import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { extname, join, normalize, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

const args = process.argv.slice(2);
const isolated = !args.includes("--no-isolation");
const dist = args.find((a) => !a.startsWith("--"));
const www = resolve(fileURLToPath(new URL(".", import.meta.url)));
const roots = dist
  ? [["/", resolve(dist)]]
  : [
      ["/data/", resolve(www, "..", "data")],
      ["/", www],
    ];
const types = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".wasm": "application/wasm",
  ".txt": "text/plain; charset=utf-8",
  ".json": "application/json",
  ".png": "image/png",
};

/** The file a URL path names, or null if it is outside the served folders. */
function fileFor(urlPath) {
  const path = decodeURIComponent(urlPath.split("?")[0]);
  for (const [prefix, dir] of roots) {
    if (!path.startsWith(prefix)) continue;
    const file = normalize(join(dir, path.slice(prefix.length) || "index.html"));
    return file === dir || file.startsWith(dir + sep) ? file : null;
  }
  return null;
}

const server = createServer(async (req, res) => {
  const file = fileFor(req.url ?? "/");
  try {
    if (!file) throw Object.assign(new Error("outside"), { code: "ENOENT" });
    const body = await readFile(file);
    // Cross-origin isolation, which WebAssembly threads (shared memory) need.
    const isolation = isolated ? { "cross-origin-opener-policy": "same-origin", "cross-origin-embedder-policy": "require-corp" } : {};
    res.writeHead(200, { "content-type": types[extname(file)] ?? "application/octet-stream", "cache-control": "no-cache", ...isolation });
    res.end(body);
  } catch (e) {
    res.writeHead(e.code === "ENOENT" || e.code === "EISDIR" ? 404 : 500, { "content-type": "text/plain" });
    res.end(e.code === "ENOENT" || e.code === "EISDIR" ? "not found\n" : "error\n");
  }
});

server.listen(Number(process.env.PORT ?? 8080), "127.0.0.1", () => {
  const { port } = server.address();
  console.log(`Alpha demo at http://127.0.0.1:${port}/`);
});
