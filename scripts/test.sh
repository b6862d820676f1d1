#!/usr/bin/env bash
# The whole test suite (the README's test command), set-up included:
#   first, what a fresh Debian 12 machine with only Rust lacks is installed once (apt packages:
#   lavapipe's Vulkan for the GPU tests, GNU time for the tests' peak-memory bounds, g++ for
#   the fuzz target's libFuzzer, Open MPI (and libclang for its bindings) for the data-parallel
#   tests, Debian's rustc-web for the no_std builds and QEMU to run one, Chromium for the browser tests; then the offline wasm
#   toolchain, scripts/setup-wasm-toolchain.sh; and pip's `tokenizers` in a virtual environment
#   under target/ for the tokenizer parity test, and PyPI's NVRTC for compiling the CUDA kernels). Each step is skipped when already done, so a
#   second run goes straight to the tests. Installing needs root (or sudo).
#   Then: formatting (cargo fmt --check), no import circles (scripts/module_cycles.py), unit
#   tests and finite-difference gradient checks,
#   the zero-allocation test, end-to-end CLI tests (bad input, hostile files and flags, seeded
#   mutations of every file Alpha reads, out of memory under ulimit, a 10,000-step soak),
#   cross-crate tests, every CUDA kernel compiled by NVRTC (none spilling registers) and the CLI built with CUDA (no GPU
#   needed; the CUDA tests themselves: scripts/cuda-check.sh on a GPU), data parallelism over
#   MPI (mpirun, 2 ranks), every GPU kernel and the
#   whole model against the CPU (on any Vulkan adapter; without a GPU, lavapipe), the products
#   again on the tensor-core kernel (on Mesa 26's lavapipe, scripts/lavapipe-coop.sh: curl and
#   xz-utils fetch it), byte-level BPE against Hugging Face `tokenizers` both ways
#   (scripts/tokenizer_parity.py), the docs (scripts/check_docs.py: links, the README's
#   commands), the embedding examples (no_alloc on the host and, under QEMU, on a Cortex-M4F), the API docs (rustdoc warnings
#   are errors), every crate packaged and built from its package, the cargo-fuzz target's build, alpha-core's no_std builds, the GEMM tests
#   again on the WebAssembly kernel (both builds), and the browser demo (alpha-web's two builds
#   from scripts/build-web.sh, then tested in Debian's Chromium through playwright-core: WebGPU
#   on SwiftShader and both WebAssembly CPU builds).
# The no_std builds use the rustup target thumbv7em-none-eabihf when it is installed, else
# Debian's rustc-web/cargo-web/rust-web-src; ALPHA_SKIP_NO_STD=1 skips them (and their set-up).
# The browser build uses the active toolchain when it has wasm32-unknown-unknown, else the one
# scripts/setup-wasm-toolchain.sh registers; ALPHA_SKIP_WEB=1 skips the browser tests (and
# their set-up).
set -euo pipefail
cd "$(dirname "$0")/.."

# Set-up. Debian's packages, where missing (dpkg knows; nothing is downloaded when all are
# there). Elsewhere than Debian, install the equivalents and this step finds nothing to do
# only if dpkg is absent.
packages="mesa-vulkan-drivers libvulkan1 curl xz-utils g++ openmpi-bin libopenmpi-dev libclang-dev time"
if [ "${ALPHA_SKIP_NO_STD:-0}" != 1 ]; then packages="$packages rustc-web cargo-web rust-web-src qemu-system-arm"; fi
if [ "${ALPHA_SKIP_WEB:-0}" != 1 ]; then packages="$packages chromium"; fi
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "error: installing needs root: run as root, or install sudo" >&2
        exit 1
    fi
}
if command -v dpkg-query >/dev/null; then
    missing=""
    for pkg in $packages; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing="$missing $pkg"
    done
    if [ -n "$missing" ]; then
        echo "installing:$missing"
        as_root apt-get update -qq
        # shellcheck disable=SC2086
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
    fi
fi
# wasm32-unknown-unknown, wasm-bindgen-cli, wasm-pack and wasm-opt without downloads from
# outside the package registries (with internet: rustup target add wasm32-unknown-unknown;
# cargo install wasm-pack). It skips what is already there.
if [ "${ALPHA_SKIP_WEB:-0}" != 1 ]; then
    as_root env HOME="$HOME" scripts/setup-wasm-toolchain.sh
fi

# Hugging Face `tokenizers` (a small wheel from PyPI) for the tokenizer parity test, in a
# virtual environment of its own.
parity_venv=target/parity-venv
if ! "$parity_venv/bin/python" -c "import tokenizers" 2>/dev/null; then
    python3 -m venv "$parity_venv"
    "$parity_venv/bin/pip" install -q --disable-pip-version-check tokenizers
fi

# NVRTC from PyPI, pinned to the lent GPU machines' CUDA 13.0, so that every CUDA kernel is
# compiled here (no GPU needed), in a virtual environment of its own.
nvrtc_venv=target/nvrtc-venv
if ! compgen -G "$nvrtc_venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13" >/dev/null; then
    python3 -m venv "$nvrtc_venv"
    "$nvrtc_venv/bin/pip" install -q --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
fi
nvrtc_lib=$(dirname "$(compgen -G "$PWD/$nvrtc_venv/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13")")

# Mesa wants a private runtime directory; without one it warns on every device it opens.
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    XDG_RUNTIME_DIR="$(mktemp -d)"
    export XDG_RUNTIME_DIR
fi

# Each stage's start and the time since the suite's (the whole suite must fit CI's limit:
# these say where it goes).
stage() {
    echo "== test.sh +$((SECONDS / 60))m$((SECONDS % 60))s: $*"
}

# Formatting first (rustfmt.toml): cheap, and it fails before the long builds.
stage "formatting, import circles"
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all --check
else
    echo "rustfmt is not installed (rustup component add rustfmt): formatting not checked"
fi

# No module imports another that imports it back, in any crate (docs/design.md).
python3 scripts/module_cycles.py --self-test
python3 scripts/module_cycles.py

stage "the workspace's tests"
cargo test --workspace --profile test-opt
# The CUDA executor without a GPU: every kernel compiles with NVRTC (a missing library fails),
# and the CLI builds with it (its GPU tests: scripts/cuda-check.sh on a lent GPU).
# (--workspace, as above: one package alone resolves its dependencies' features apart and
# rebuilds them.)
stage "CUDA kernels through NVRTC, the CLI with CUDA"
LD_LIBRARY_PATH="$nvrtc_lib" ALPHA_REQUIRE_NVRTC=1 cargo test --profile test-opt --workspace --test kernels_compile
cargo build -q --profile test-opt -p alpha-native --features cuda
# The tensor-core GEMM (and every other product) against the CPU on a lavapipe with
# cooperative matrices: Mesa 26's, which scripts/lavapipe-coop.sh unpacks from Debian 13's
# backports under target/ (Debian 12's has none).
stage "the tensor-core GEMM on Mesa 26's lavapipe"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/lavapipe-coop.sh" ALPHA_GPU_TENSOR_CORES=1 \
    cargo test --profile test-opt --workspace --test kernels -- matmul f16
# Data parallelism: the build with MPI, its ranks launched by Open MPI's mpirun (as root in
# CI containers: the two variables allow it).
stage "data parallelism over MPI"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 cargo test --profile test-opt -p alpha-native --features mpi --test mpi
stage "tokenizer parity, docs, embedding examples"
cargo build -q --profile test-opt -p alpha-native
"$parity_venv/bin/python" scripts/tokenizer_parity.py target/test-opt/alpha-native
# The docs: every relative link resolves and every README command that runs offline exits 0.
python3 scripts/check_docs.py target/test-opt/alpha-native
# Training and sampling without an allocator (it counts the allocator's calls: none).
cargo run -q --profile test-opt -p alpha-core --example no_alloc
# The embedding examples: train a Llama-family model and save it, then generate from that
# checkpoint and from a Hugging Face directory (the Llama fixture), through alpha_core alone.
example_ckpt=target/example-train.safetensors
cargo run -q --profile test-opt -p alpha-core --example train --features std,checkpoint -- data/shakespeare.txt "$example_ckpt" 60
cargo run -q --profile test-opt -p alpha-core --example generate --features std,checkpoint -- "$example_ckpt" "ROMEO:" 20
cargo run -q --profile test-opt -p alpha-core --example generate --features std,checkpoint -- tests/data/llama-fixture "ROMEO:" 12
# The same on wgpu (lavapipe here): train, evaluate, sample, save; then generate from it.
cargo run -q --profile test-opt -p alpha-gpu --example train_gpu -- data/shakespeare.txt "$example_ckpt" 20
cargo run -q --profile test-opt -p alpha-core --example generate --features std,checkpoint -- "$example_ckpt" "ROMEO:" 20
stage "API docs, packages, fuzz target"
# The API docs (the crates are meant to be embedded): no broken or private links, no stray HTML.
RUSTDOCFLAGS="-D warnings" cargo doc -q --workspace --no-deps
# Every crate packages and builds from its packaged sources alone.
scripts/package-check.sh --quiet
# The fuzz target builds (a plain build: libFuzzer without coverage instrumentation; longer
# runs by hand with cargo-fuzz, see docs/guide.md).
cargo build -q --manifest-path fuzz/Cargo.toml

if [ "${ALPHA_SKIP_NO_STD:-0}" != 1 ]; then
    stage "no_std builds, the no_alloc example on a Cortex-M4F"
    target=thumbv7em-none-eabihf
    for features in "" "--features alloc" "--features checkpoint" "--features bpe"; do
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
    # The no_alloc example on bare metal: linked for the Cortex-M4F, run under QEMU.
    scripts/no-alloc-arm.sh
fi

if [ "${ALPHA_SKIP_WEB:-0}" != 1 ]; then
    stage "browser demo: wasm-pack build of alpha-web, then the Chromium tests"
    if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
        # shellcheck disable=SC1091
        . "$HOME/.config/wasm-toolchain.env"
        export RUSTUP_TOOLCHAIN="$WASM_TOOLCHAIN"
    fi
    # The builds, and the page as one folder a static host serves (the browser tests serve it).
    scripts/build-web.sh --dist target/www-dist
    # alpha-core's GEMM tests on the WebAssembly kernel (the rest of the suite ran natively),
    # under node with wasm-bindgen's test runner (no -q: the runner refuses libtest's --quiet),
    # in both builds: SIMD128, and relaxed SIMD (its multiply-add kernel; target directory as
    # in build-web.sh). Node 20 runs relaxed SIMD only behind a V8 flag, which the runner does
    # not pass and NODE_OPTIONS does not accept: a `node` first on PATH adds it where needed.
    stage "the GEMM tests on WebAssembly"
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
    stage "the browser tests"
    cargo build -q --profile test-opt -p alpha-native
    (cd www && npm ci --no-audit --no-fund --silent && ALPHA_NATIVE="$PWD/../target/test-opt/alpha-native" \
        ALPHA_WEB_DIST="$PWD/../target/www-dist" npm test --silent)
fi
stage "done"
