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
#
# With --dist DIR it then writes the whole page into DIR, one folder any static host serves:
# the page's files, the three builds (JavaScript and WebAssembly only), the Shakespeare corpus
# and `_headers` (the two headers that make the page cross-origin isolated, in the format
# Netlify and Cloudflare Pages read; elsewhere, set them in the server's configuration: without
# them the page trains on one CPU thread and says so). DIR must be new, empty, or a folder an
# earlier --dist wrote (it holds `.alpha-dist`), which is replaced.
set -euo pipefail
dist=""
case "${1:-}" in
    --dist)
        [ -n "${2:-}" ] || { echo "error: --dist needs a folder" >&2; exit 1; }
        dist="$(realpath -m "$2")" ;;
    "") ;;
    *) echo "error: unknown argument $1 (the one option is --dist DIR)" >&2; exit 1 ;;
esac
if [ -n "$dist" ] && [ -e "$dist" ]; then
    if [ ! -d "$dist" ]; then
        echo "error: --dist $dist exists and is not a folder" >&2; exit 1
    fi
    if [ -n "$(ls -A "$dist")" ] && [ ! -f "$dist/.alpha-dist" ]; then
        echo "error: --dist $dist is a folder that holds other files; give a new or empty one" >&2; exit 1
    fi
fi
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

if [ -n "$dist" ]; then
    # Written beside the target, then swapped in: an interrupted build leaves DIR as it was.
    www="$(cd ../www && pwd)"
    staging="$(mktemp -d "$(dirname "$dist")/.alpha-dist.XXXXXX")"
    cp "$www/index.html" "$www/main.js" "$www/charts.js" "$www/runs.js" "$www/zip.js" "$www/style.css" "$staging/"
    for build in pkg pkg-relaxed pkg-threads; do
        (cd "$www" && find "$build" -name '*.js' -o -name '*.wasm') | while read -r f; do
            mkdir -p "$staging/$(dirname "$f")"
            cp "$www/$f" "$staging/$f"
        done
    done
    mkdir "$staging/data"
    cp ../data/shakespeare.txt "$staging/data/"
    printf '/*\n  Cross-Origin-Opener-Policy: same-origin\n  Cross-Origin-Embedder-Policy: require-corp\n' > "$staging/_headers"
    echo "the page, built by scripts/build-web.sh --dist; replaced by the next one" > "$staging/.alpha-dist"
    chmod 755 "$staging"
    rm -rf "$dist"
    mv "$staging" "$dist"
    echo "the page is in $dist: serve it with the headers of $dist/_headers (for example: node www/serve.mjs $dist)"
fi
