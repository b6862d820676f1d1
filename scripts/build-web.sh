#!/usr/bin/env bash
# Builds alpha-web for the browser demo with wasm-pack, twice:
#   www/pkg          WebAssembly SIMD128 (.cargo/config.toml), which every current browser runs;
#   www/pkg-relaxed  SIMD128 plus relaxed SIMD, whose fused multiply-add makes the CPU GEMM
#                    faster; the page loads it where the browser validates relaxed SIMD.
# Needs the wasm32-unknown-unknown target and wasm-pack (README, "In the browser").
set -euo pipefail
cd "$(dirname "$0")/../web"
wasm-pack --quiet build --target web --release --out-dir ../www/pkg --no-pack
# Its own target directory: other flags in the same one would rebuild everything each time.
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
    CARGO_TARGET_DIR=../target/wasm-relaxed-simd \
    wasm-pack --quiet build --target web --release --out-dir ../www/pkg-relaxed --no-pack
