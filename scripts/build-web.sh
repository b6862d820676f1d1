#!/usr/bin/env bash
# Builds alpha-web for the browser demo with wasm-pack, three times:
#   www/pkg          WebAssembly SIMD128 (.cargo/config.toml), which every current browser runs;
#   www/pkg-relaxed  SIMD128 plus relaxed SIMD, whose fused multiply-add makes the CPU GEMM
#                    faster; the page loads it where the browser validates relaxed SIMD.
#   www/pkg-threads  relaxed SIMD and WebAssembly threads (shared memory and atomics; std is
#                    rebuilt with them, -Zbuild-std), so the CPU engine runs on every core;
#                    the page loads it where it is cross-origin isolated (serve.mjs sends the
#                    headers) and the browser validates relaxed SIMD.
# Needs the wasm32-unknown-unknown target and wasm-pack (docs/guide.md, "In the browser").
set -euo pipefail
cd "$(dirname "$0")/../web"
wasm-pack --quiet build --target web --release --out-dir ../www/pkg --no-pack
# Its own target directory: other flags in the same one would rebuild everything each time.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
    CARGO_TARGET_DIR=../target/wasm-relaxed-simd \
    wasm-pack --quiet build --target web --release --out-dir ../www/pkg-relaxed --no-pack
# Threads: the linker makes the memory shared and imported (each worker instantiates the module
# on it) and exports what wasm-bindgen needs to give every thread its own TLS and stack.
threads_flags="-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128,+relaxed-simd"
for arg in --shared-memory --max-memory=4294967296 --import-memory --export=__wasm_init_tls \
    --export=__tls_size --export=__tls_align --export=__tls_base; do
    threads_flags="$threads_flags -C link-arg=$arg"
done
RUSTC_BOOTSTRAP=1 CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="$threads_flags" \
    CARGO_TARGET_DIR=../target/wasm-threads \
    wasm-pack --quiet build --target web --release --out-dir ../www/pkg-threads --no-pack . -- -Zbuild-std=std,panic_abort
