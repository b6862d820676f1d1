#!/usr/bin/env bash
# Packages every crate of the workspace as a registry would receive it (`cargo package`) and
# builds each from its packaged sources alone (the workspace's crates resolved among the
# packages, not the checkout), so that nothing a crate needs lies outside it: the presets
# (core/config), the WGSL kernels (gpu/shaders), the CUDA kernels (cuda/kernels), the CLI's
# assets (native/assets). Those folders are symbolic links into the workspace's own, which
# `cargo package` copies. Uncommitted changes are packaged as they are (--allow-dirty).
# About 2.5 minutes on a 2-core machine with an empty target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package --workspace --allow-dirty "$@"
