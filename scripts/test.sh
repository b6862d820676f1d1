#!/usr/bin/env bash
# The whole test suite (the README's test command):
#   unit tests and finite-difference gradient checks, the zero-allocation test, end-to-end
#   CLI tests, cross-crate tests, the embedding example, and alpha-core's no_std builds.
# The no_std builds need Debian's rustc-web/cargo-web/rust-web-src (.ci/run installs them);
# set ALPHA_SKIP_NO_STD=1 to skip them on a machine without those packages.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --profile test-opt
cargo run --profile test-opt -p alpha-core --example tiny --features alloc

if [ "${ALPHA_SKIP_NO_STD:-0}" != 1 ]; then
    for features in "" "--features alloc"; do
        echo "no_std build of alpha-core for thumbv7em-none-eabihf ${features:-(no features)}"
        # shellcheck disable=SC2086
        RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo build -q -p alpha-core $features \
            --target thumbv7em-none-eabihf -Zbuild-std=core,alloc --target-dir target/no-std
    done
fi
