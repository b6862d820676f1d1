#!/usr/bin/env bash
# Packages every crate of the workspace as a registry would receive it (`cargo package`) and
# builds each from its packaged sources alone (the workspace's crates resolved among the
# packages, not the checkout), so that nothing a crate needs lies outside it: the presets
# (core/config), the WGSL kernels (gpu/shaders), the CUDA kernels (cuda/kernels), the CLI's
# assets (native/assets). Those folders are symbolic links into the workspace's own, which
# `cargo package` copies. Uncommitted changes are packaged as they are (--allow-dirty).
# About 2.5 minutes on a 2-core machine the first time (its own target directory,
# target/package-check), under a minute after.
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo takes a registry's crate of a given version as never changing: it unpacks each package
# once per local registry (keyed by the registry's path) and keeps what it compiled of it, so a
# crate whose sources changed but not its version would be verified against the old ones.
# Forget both for this workspace's crates: the unpacked copies (the unnamed `-HASH` registries
# are local ones; crates.io's is named) and, in this check's own target directory, their
# builds (the dependencies' builds stay).
for dir in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/; do
    [ -d "$dir" ] && rm -rf "$dir"alpha-core-* "$dir"alpha-gpu-* "$dir"alpha-cuda-* "$dir"alpha-native-* "$dir"alpha-web-*
done
target_dir=target/package-check
rm -rf "$target_dir"/debug/.fingerprint/alpha-* "$target_dir"/debug/deps/libalpha_* "$target_dir"/debug/deps/alpha_*
cargo package --workspace --allow-dirty --target-dir "$target_dir" "$@"
