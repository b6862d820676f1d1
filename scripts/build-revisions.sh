#!/usr/bin/env bash
# Builds alpha-native (release) at each git revision given, for timing builds against each
# other on one machine (`scripts/gpu-bench.sh` with GPU_BENCH_BASELINES, or
# `scripts/compare_builds.py`): a kernel variant is a branch or commit, its binary
# OUT_DIR/alpha-<short hash>. Prints LABEL=PATH per build, GPU_BENCH_BASELINES' form.
#
#   scripts/build-revisions.sh OUT_DIR REV...      e.g. scripts/build-revisions.sh /tmp/builds HEAD~3 my-variant
#
# Each revision is checked out in a temporary worktree and built in one shared target
# directory (target/revisions: the dependencies compile once). Cargo decides what to rebuild
# from file times, and a fresh checkout's files are older than the last build's outputs, so
# the workspace's sources are touched before each build; without that, every revision after
# the first would silently be the first one's binary.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/build-revisions.sh OUT_DIR REV..." >&2; exit 1; }
cd "$(dirname "$0")/.."
root=$PWD
out=$(mkdir -p "$1" && cd "$1" && pwd)
shift
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true; rm -rf "$work"' EXIT
for rev in "$@"; do
    hash=$(git rev-parse --short "$rev^{commit}")
    git worktree add -q --detach "$work/tree" "$hash"
    (
        cd "$work/tree"
        find . -name target -prune -o -type f \( -name '*.rs' -o -name '*.wgsl' -o -name '*.toml' \) -print0 | xargs -0 touch
        CARGO_TARGET_DIR="$root/target/revisions" cargo build --release -q -p alpha-native
    )
    cp "$root/target/revisions/release/alpha-native" "$out/alpha-$hash"
    git worktree remove --force "$work/tree"
    echo "$hash=$out/alpha-$hash"
done
