#!/usr/bin/env bash
# Runs a program on a lavapipe with cooperative matrices, so that the tensor-core kernels
# (shaders/matmul_tensor.wgsl) run and are tested without a GPU:
#   scripts/lavapipe-coop.sh PROGRAM [ARGS...]     (an executable, not a script; programs it
#                                                   starts run on the system's libraries)
# or as cargo's runner for test binaries:
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/scripts/lavapipe-coop.sh" \
#       ALPHA_GPU_TENSOR_CORES=1 cargo test --profile test-opt -p alpha-gpu --test kernels
#
# Debian 12's lavapipe (Mesa 22.3) has no cooperative matrices; Mesa 26's has
# VK_KHR_cooperative_matrix. The first run unpacks Mesa's Vulkan drivers from Debian 13's
# backports, with the libraries they need from Debian 13 (glibc 2.41, LLVM 19), into
# target/lavapipe-coop (ALPHA_LAVAPIPE_DIR), downloading the packages from deb.debian.org
# (about 75 MB; nothing is installed into the system). Commands then run under that glibc's
# dynamic loader with only that lavapipe as Vulkan driver. It reports 8 x 8 x 8 matrices
# only, yet runs the kernels' 16 x 16 x 16 f16 -> f32 products correctly (the kernel tests
# fail when a block product is taken from the wrong operands), so the command runs with
# ALPHA_GPU_UNREPORTED_COOP_SHAPES=1, which lets alpha-gpu take the tensor-core path there
# (see `tensor_core_support` in gpu/src/context.rs). Its subgroups have 8 invocations: each
# 32-invocation group of the kernel is four of them, each doing the group's matrix work.
set -euo pipefail
root="${ALPHA_LAVAPIPE_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target/lavapipe-coop}"
mirror="${ALPHA_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
lib="$root/sysroot/usr/lib/x86_64-linux-gnu"

if [ ! -f "$root/ready" ]; then
    echo "lavapipe-coop: unpacking Mesa's lavapipe from Debian 13 backports into $root" >&2
    mkdir -p "$root/debs"
    for suite in trixie trixie-backports; do
        curl -fsSL "$mirror/dists/$suite/main/binary-amd64/Packages.xz" | xz -dc > "$root/Packages-$suite"
    done
    # The packages: Mesa's Vulkan drivers from backports; the Vulkan loader, glibc, the C++
    # runtime and every dependency of them all from Debian 13 (from backports where 13 lacks
    # one), alternatives by their first choice. Printed as paths in the archive.
    python3 - "$root" > "$root/files" <<'EOF'
import sys
root = sys.argv[1]
def index(suite):
    packages, fields = {}, {}
    for line in open(f"{root}/Packages-{suite}"):
        if not line.strip():
            if fields:
                packages[fields["Package"]] = fields
            fields = {}
        elif not line[0].isspace():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return packages
trixie, backports = index("trixie"), index("trixie-backports")
# Essential packages that only their maintainer scripts need.
skip = {"debconf", "debconf-2.0", "perl-base", "dpkg", "usr-is-merged", "libc-bin"}
todo = [("mesa-vulkan-drivers", backports), ("libvulkan1", trixie), ("libc6", trixie), ("libstdc++6", trixie)]
seen = set()
while todo:
    name, suite = todo.pop()
    if name in seen or name in skip:
        continue
    fields = suite.get(name) or trixie.get(name) or backports.get(name)
    if fields is None:
        sys.exit(f"lavapipe-coop: {name} is in neither Debian 13 nor its backports")
    seen.add(name)
    print(fields["Filename"])
    for dep in (fields.get("Depends", "") + "," + fields.get("Pre-Depends", "")).split(","):
        if dep.strip():
            todo.append((dep.split("|")[0].split()[0].split(":")[0], trixie))
EOF
    rm -rf "$root/sysroot"
    while read -r file; do
        deb="$root/debs/$(basename "$file")"
        [ -f "$deb" ] || curl -fsSL -o "$deb" "$mirror/$file"
        dpkg-deb -x "$deb" "$root/sysroot"
    done < "$root/files"
    printf '{"file_format_version": "1.0.0", "ICD": {"api_version": "1.4.0", "library_path": "%s"}}\n' \
        "$lib/libvulkan_lvp.so" > "$root/lvp_icd.json"
    touch "$root/ready"
fi

export VK_DRIVER_FILES="$root/lvp_icd.json" VK_ICD_FILENAMES="$root/lvp_icd.json"
export ALPHA_GPU_UNREPORTED_COOP_SHAPES=1
if [ -z "${XDG_RUNTIME_DIR:-}" ]; then
    XDG_RUNTIME_DIR="$(mktemp -d)"
    export XDG_RUNTIME_DIR
fi
exec "$root/sysroot/usr/lib64/ld-linux-x86-64.so.2" --library-path "$lib" "$@"
