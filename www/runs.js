// Runs kept in this browser (IndexedDB, database "alpha", store "runs"): each run's last
// checkpoint (its model, tokenizer, optimizer state and settings, alpha-native's format), the
// text it trains on, and its records, so that a reload offers to resume it. Each save is one
// transaction: a save the browser refuses (its storage quota) leaves the run's previous save
// whole.

const DATABASE = "alpha";
const STORE = "runs";

/** The database, opened (and made, the first time). */
function database() {
  return new Promise((resolve, reject) => {
    const request = indexedDB.open(DATABASE, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(STORE, { keyPath: "id" });
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

/** Runs `body(store)` in one transaction on the runs; resolves to what its last request gave
 * once the transaction has committed, rejects with the transaction's error. */
async function transaction(mode, body) {
  const db = await database();
  return new Promise((resolve, reject) => {
    const tx = db.transaction(STORE, mode);
    let result;
    const request = body(tx.objectStore(STORE));
    request.onsuccess = () => (result = request.result);
    tx.oncomplete = () => {
      db.close();
      resolve(result);
    };
    tx.onerror = tx.onabort = () => {
      db.close();
      reject(tx.error ?? request.error ?? new Error("the browser's storage refused"));
    };
  });
}

/** Keeps `run`: `{ id, name, savedAt, step, iters, corpus, text, checkpoint, records }`,
 * replacing the run's earlier save. A refusal (QuotaExceededError where the storage is full)
 * rejects with a one-line Error; the earlier save stays. */
export async function keepRun(run) {
  try {
    await transaction("readwrite", (store) => store.put(run));
  } catch (e) {
    const quota = e?.name === "QuotaExceededError";
    throw new Error(
      quota
        ? `the browser's storage quota refused to keep this run (${(run.checkpoint.length / 2 ** 20).toFixed(1)} MiB); its last kept save is unchanged, and Download checkpoint keeps it as a file`
        : `the browser could not keep this run: ${e?.message ?? e}`,
    );
  }
}

/** The runs kept, newest first. */
export async function keptRuns() {
  const runs = await transaction("readonly", (store) => store.getAll());
  return runs.sort((a, b) => b.savedAt - a.savedAt);
}

/** Forgets run `id`. */
export function forgetRun(id) {
  return transaction("readwrite", (store) => store.delete(id));
}
