#!/usr/bin/env bash
# alpha-core's `no_alloc` example on bare metal: built for the Cortex-M4F
# (thumbv7em-none-eabihf, no features, no allocator), linked by rust-lld with
# core/examples/no_alloc.ld, and run on QEMU's mps2-an386 board, its output through
# semihosting; exits non-zero where the build, the run or its checks fail.
#
# Needs qemu-system-arm (Debian's qemu-system-arm) and the target: the rustup target where it
# is installed, else Debian's rustc-web building core from its source (as scripts/test.sh's
# no_std builds).
set -euo pipefail
cd "$(dirname "$0")/.."
target=thumbv7em-none-eabihf
dir=target/no-std
# panic = "abort": the target has no unwinding (the workspace's release profile unwinds).
args=(build -q -p alpha-core --example no_alloc --release --target "$target" --target-dir "$dir"
      --config 'profile.release.panic="abort"')
export RUSTFLAGS="-C link-arg=-T$PWD/core/examples/no_alloc.ld"
if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    cargo "${args[@]}"
else
    RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 /usr/bin/cargo "${args[@]}" -Zbuild-std=core
fi
elf="$dir/$target/release/examples/no_alloc"
echo "$elf: $(stat -c %s "$elf") bytes (ELF with symbols)"
timeout 600 qemu-system-arm -machine mps2-an386 -nographic -monitor none -serial none \
    -semihosting-config enable=on,target=native -kernel "$elf"
