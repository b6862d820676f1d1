// Starts the Web Workers of alpha-web's CPU thread pool (the WebAssembly threads build): each
// instantiates this page's module on its shared memory, says it is ready, and runs one worker
// loop of the pool (web/src/threads.rs) until the pool is dropped.
export function startWorkers(module, memory, entries) {
  // wasm-bindgen copies this file to pkg/snippets/<crate>/src/: its module is three levels up.
  const main = new URL("../../../alpha_web.js", import.meta.url).href;
  const source = `import init, { worker_entry } from ${JSON.stringify(main)};
self.onmessage = async ({ data: { module, memory, entry } }) => {
  await init({ module_or_path: module, memory });
  self.postMessage("ready");
  worker_entry(entry);
};`;
  const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
  // `entries` is a Uint32Array, whose own map() would make numbers of the promises.
  const started = Array.from(
    entries,
    (entry, i) =>
      new Promise((resolve, reject) => {
        const worker = new Worker(url, { type: "module", name: `alpha-worker-${i + 1}` });
        worker.onmessage = () => resolve();
        worker.onerror = (e) => reject(new Error(`worker ${i + 1} did not start: ${e.message}`));
        worker.postMessage({ module, memory, entry });
      }),
  );
  return Promise.all(started).finally(() => URL.revokeObjectURL(url));
}
