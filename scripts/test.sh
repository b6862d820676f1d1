#!/usr/bin/env bash
# The whole test suite (the README's test command):
#   formatting (cargo fmt --check), unit tests and finite-difference gradient checks, the
#   zero-allocation test, end-to-end CLI tests, cross-crate tests, every GPU kernel and the
#   whole model against the CPU (on any Vulkan adapter; without a GPU, lavapipe from
#   mesa-vulkan-drivers), the embedding example, the API docs (rustdoc warnings are errors),
#   alpha-core's no_std builds, the GEMM tests again on the WebAssembly kernel (both builds),
#   and the browser demo (alpha-web's two builds from scripts/build-web.sh, then tested in
#   Debian's Chromium through playwright-core: WebGPU on SwiftShader and both WebAssembly CPU
#   builds).
# The no_std builds use the rustup target thumbv7em-none-eabihf when it is installed, else
# Debian's rustc-web/cargo-web/rust-web-src (.ci/run installs them); ALPHA_SKIP_NO_STD=1 skips.
# The browser build uses the active toolchain when it has wasm32-unknown-unknown, else the one
# scripts/setup-wasm-toolchain.sh registers; ALPHA_SKIP_WEB=1 skips the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# Mesa wants a private runtime directory; without one it warns on every device it opens.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    XDG_RUNTIME_DIR="$(mktemp -d)"
    export XDG_RUNTIME_DIR
fi

# Formatting first (rustfmt.toml): cheap, and it fails before the long builds.
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all --check
else
    echo "rustfmt is not installed (rustup component add rustfmt): formatting not checked"
fi

cargo test --workspace --profile test-opt
cargo run --profile test-opt -p alpha-core --example tiny --features alloc
# The API docs (the crates are meant to be embedded): no broken or private links, no stray HTML.
RUSTDOCFLAGS="-D warnings" cargo doc -q --workspace --no-deps

if [ "${ALPHA_SKIP_NO_STD:-0}" != 1 ]; then
    target=thumbv7em-none-eabihf
    for features in "" "--features alloc" "--features checkpoint"; do
        echo "no_std build of alpha-core for $target ${features:-(no features)}"
        if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
            # shellcheck disable=SC2086
            cargo build -q -p alpha-core $features --target "$target" --target-dir target/no-std
        else
            # Offline: Debian's rustc-web builds core and alloc from its std source.
            # shellcheck disable=SC2086
            RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo build -q -p alpha-core $features \
                --target "$target" -Zbuild-std=core,alloc --target-dir target/no-std
        fi
    done
fi

if [ "${ALPHA_SKIP_WEB:-0}" != 1 ]; then
    echo "browser demo: wasm-pack build of alpha-web, then the Chromium tests"
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        # shellcheck disable=SC1091
        . "$HOME/.config/wasm-toolchain.env"
        export RUSTUP_TOOLCHAIN="$WASM_TOOLCHAIN"
    fi
    scripts/build-web.sh
    # alpha-core's GEMM tests on the WebAssembly kernel (the rest of the suite ran natively),
    # under node with wasm-bindgen's test runner (no -q: the runner refuses libtest's --quiet),
    # in both builds: SIMD128, and relaxed SIMD (its multiply-add kernel; target directory as
    # in build-web.sh). Node 20 runs relaxed SIMD only behind a V8 flag, which the runner does
    # not pass and NODE_OPTIONS does not accept: a `node` first on PATH adds it where needed.
    export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
    cargo test -p alpha-core --lib --profile test-opt --target wasm32-unknown-unknown
    node_shim="$(mktemp -d)"
    real_node="$(command -v node)"
    relaxed_flag=""
    if "$real_node" --experimental-wasm-relaxed-simd -e 0 2>/dev/null; then
        relaxed_flag="--experimental-wasm-relaxed-simd"
    fi
    printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$real_node" "$relaxed_flag" > "$node_shim/node"
    chmod +x "$node_shim/node"
    PATH="$node_shim:$PATH" CARGO_TARGET_DIR=target/wasm-relaxed-simd \
        CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="-C target-feature=+simd128,+relaxed-simd" \
        cargo test -p alpha-core --lib --profile test-opt --target wasm32-unknown-unknown
    unset CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER
    unset RUSTUP_TOOLCHAIN
    cargo build -q --profile test-opt -p alpha-native
    (cd www && npm ci --no-audit --no-fund --silent && ALPHA_NATIVE="$PWD/../target/test-opt/alpha-native" npm test --silent)
fi
