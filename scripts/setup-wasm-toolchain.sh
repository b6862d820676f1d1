#!/usr/bin/env bash
# (The team's shared offline wasm setup script, kept here unchanged so that .ci/run works
# from any clone.)
# setup-wasm-toolchain.sh - make `cargo build --target wasm32-unknown-unknown`,
# wasm-bindgen, wasm-opt and wasm-pack work on a Debian 12 (bookworm) x86-64
# machine whose rustup has no wasm32 rust-std and no rust-src.
#
# How: Debian bookworm-security ships rustc-web/cargo-web 1.96 and the matching
# std source (rust-web-src). We compile std for wasm32-unknown-unknown ONCE with
# cargo's -Zbuild-std (RUSTC_BOOTSTRAP=1), put the rlibs into Debian's own
# sysroot (/usr/lib/rustlib/wasm32-unknown-unknown/lib), and register a rustup
# custom toolchain "debian-web" (a directory of symlinks to /usr/bin/rustc,
# cargo, rustdoc). Afterwards no -Zbuild-std and no RUSTC_BOOTSTRAP are needed:
#     cargo +debian-web build --release --target wasm32-unknown-unknown
#     RUSTUP_TOOLCHAIN=debian-web wasm-pack build --target web
#
# If the active rustup toolchain already lists wasm32-unknown-unknown in
# `rustup target list --installed`, the whole toolchain part is skipped and
# that toolchain is used instead.  The tools part (wasm-bindgen-cli, wasm-pack,
# wasm-opt from npm `binaryen`) runs in both cases; each tool is skipped when
# the wanted version is already on PATH.  Safe to run again (idempotent); std
# is rebuilt only when /usr/bin/rustc -vV changes (e.g. a Debian update).
#
# Run as root from the crate/workspace root (Cargo.lock is read from there).
# Writes $WASM_ENV_FILE with WASM_TOOLCHAIN=<name>; use it like:
#     . "$HOME/.config/wasm-toolchain.env"
#     cargo +"$WASM_TOOLCHAIN" build --release --target wasm32-unknown-unknown
#     RUSTUP_TOOLCHAIN="$WASM_TOOLCHAIN" wasm-pack build --target web --release
#
# Knobs (environment):
#   WASM_BINDGEN_VERSION  exact wasm-bindgen-cli version (default: the
#                         wasm-bindgen version in $CARGO_LOCK, else 0.2.130)
#   CARGO_LOCK            default ./Cargo.lock
#   WASM_PACK_VERSION     default 0.15.1      ("" = don't install wasm-pack)
#   BINARYEN_NPM_VERSION  default 132.0.0     ("" = don't install wasm-opt)
#   WASM_TC_NAME          default debian-web
#   WASM_TC_DIR           default /opt/rust-web-wasm32
#   WASM_TOOLS_DIR        default /opt/wasm-tools   (npm prefix for binaryen)
#   WASM_ENV_FILE         default $HOME/.config/wasm-toolchain.env
#   JOBS                  default $(nproc)
set -euo pipefail

TARGET=wasm32-unknown-unknown
WASM_TC_NAME=${WASM_TC_NAME:-debian-web}
WASM_TC_DIR=${WASM_TC_DIR:-/opt/rust-web-wasm32}
WASM_TOOLS_DIR=${WASM_TOOLS_DIR:-/opt/wasm-tools}
WASM_ENV_FILE=${WASM_ENV_FILE:-$HOME/.config/wasm-toolchain.env}
WASM_PACK_VERSION=${WASM_PACK_VERSION-0.15.1}
BINARYEN_NPM_VERSION=${BINARYEN_NPM_VERSION-132.0.0}
CARGO_LOCK=${CARGO_LOCK:-Cargo.lock}
JOBS=${JOBS:-$(nproc)}
DEB_PKGS="rustc-web cargo-web rust-web-src rust-web-llvm"
STD_CRATES="std,panic_abort,panic_unwind,test,proc_macro"

log() { printf '[wasm-setup %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
command -v rustup >/dev/null || die "rustup not found"

apt_updated=0
apt_install() {  # apt_install PKG...
    if [ "$apt_updated" = 0 ]; then
        log "apt-get update"
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        apt_updated=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 \
        install -y -qq --no-install-recommends "$@" >/dev/null
}
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed'; }

rustup_has_target() {
    rustup target list --installed 2>/dev/null | grep -qx "$TARGET"
}

# ---------------------------------------------------------------- toolchain --
setup_debian_toolchain() {
    # 1. Debian packages (rustc 1.96 + cargo + std source + rust-lld link).
    local missing="" p
    for p in $DEB_PKGS; do pkg_installed "$p" || missing="$missing $p"; done
    # shellcheck disable=SC2086
    [ -z "$missing" ] || apt_install $missing
    # rust-web-llvm ships /usr/bin/rust-lld -> lld-NN but does not depend on
    # lld-NN; install the lld version the link points at.
    if [ ! -e /usr/bin/rust-lld ]; then
        local lld; lld=$(basename "$(readlink /usr/bin/rust-lld)")
        [ -n "$lld" ] || die "/usr/bin/rust-lld missing (rust-web-llvm not installed?)"
        apt_install "$lld"
    fi
    [ -e /usr/bin/rust-lld ] || die "/usr/bin/rust-lld still dangling"

    # 2. std for wasm32 into Debian's sysroot, rebuilt only if rustc changed.
    local sysroot; sysroot=$(/usr/bin/rustc --print sysroot)
    [ -n "$sysroot" ] && [ -d "$sysroot/lib/rustlib/src/rust/library" ] \
        || die "std source not found under '$sysroot/lib/rustlib/src/rust' (rust-web-src)"
    local tdir="$sysroot/lib/rustlib/$TARGET"
    local stamp="$tdir/.debian-rustc-vV"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(/usr/bin/rustc -vV)" ] \
        && compgen -G "$tdir/lib/libstd-*.rlib" >/dev/null; then
        log "wasm32 std already built for $(/usr/bin/rustc -V)"
    else
        log "building std for $TARGET with $(/usr/bin/rustc -V) (-Zbuild-std, ~1-2 min)"
        local work; work=$(mktemp -d /tmp/wasm-std-build.XXXXXX)
        mkdir -p "$work/src"
        cat > "$work/Cargo.toml" <<'EOF'
[package]
name = "wasm-std-build-dummy"
version = "0.0.0"
edition = "2021"
publish = false
[lib]
path = "src/lib.rs"
[profile.release]
opt-level = 3
debug = false
codegen-units = 1
lto = false
incremental = false
EOF
        echo '#![no_std]' > "$work/src/lib.rs"
        # -Cembed-bitcode=yes: keep LLVM bitcode in the rlibs (like rustup's
        # std) so that crates built with `lto = true` still link.
        (cd "$work" && env -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS \
            -u CARGO_BUILD_TARGET -u CARGO_TARGET_DIR -u RUSTC_WRAPPER \
            -u RUSTC_WORKSPACE_WRAPPER -u RUSTUP_TOOLCHAIN \
            RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            RUSTFLAGS="-Cembed-bitcode=yes" CARGO_TARGET_DIR="$work/target" \
            /usr/bin/cargo build --quiet --release --target "$TARGET" -j "$JOBS" \
                -Zbuild-std="$STD_CRATES")
        local stage="$tdir/lib.new" f n=0
        rm -rf "$stage"; mkdir -p "$stage"
        for f in "$work/target/$TARGET/release/deps/"lib*.rlib; do
            case "${f##*/}" in libwasm_std_build_dummy-*) continue ;; esac
            cp "$f" "$stage/"; n=$((n + 1))
        done
        [ "$n" -gt 10 ] && compgen -G "$stage/libstd-*.rlib" >/dev/null \
            || die "std build produced no libstd rlib"
        rm -rf "$tdir/lib"; mv "$stage" "$tdir/lib"
        /usr/bin/rustc -vV > "$stamp"
        rm -rf "$work"
        log "installed $n rlibs into $tdir/lib ($(du -sh "$tdir/lib" | cut -f1))"
    fi

    # 3. rustup custom toolchain: symlinks only (rustc finds its sysroot, /usr,
    #    from librustc_driver's location, so the symlinks need nothing else).
    mkdir -p "$WASM_TC_DIR/bin" "$WASM_TC_DIR/lib"
    for p in rustc rustdoc cargo; do ln -sfn "/usr/bin/$p" "$WASM_TC_DIR/bin/$p"; done
    # never `rm -r` through this link: it points at the real /usr/lib/rustlib
    if [ -d "$WASM_TC_DIR/lib/rustlib" ] && [ ! -L "$WASM_TC_DIR/lib/rustlib" ]; then
        rm -rf "$WASM_TC_DIR/lib/rustlib"
    fi
    ln -sfn "$sysroot/lib/rustlib" "$WASM_TC_DIR/lib/rustlib"
    rustup toolchain link "$WASM_TC_NAME" "$WASM_TC_DIR"

    # 4. smoke test: a std-using cdylib, no cargo, no network.
    local t; t=$(mktemp -d /tmp/wasm-smoke.XXXXXX)
    printf '%s\n' '#[no_mangle] pub extern "C" fn f(n: u32) -> u32 {' \
        '  let v: Vec<u32> = (0..n).collect(); format!("{n}").len() as u32 + v.iter().sum::<u32>() }' \
        > "$t/t.rs"
    rustup run "$WASM_TC_NAME" rustc --edition 2021 --target "$TARGET" \
        --crate-type cdylib -O "$t/t.rs" -o "$t/t.wasm" \
        || die "smoke test: rustc +$WASM_TC_NAME cannot build for $TARGET"
    rm -rf "$t"
    log "toolchain '$WASM_TC_NAME' ($(rustup run "$WASM_TC_NAME" rustc -V)) builds $TARGET"
}

# -------------------------------------------------------------------- tools --
cargo_install() {  # cargo_install CRATE VERSION
    # --locked first; wasm-bindgen-cli 0.2.130's lock pins webpki-roots 1.0.11,
    # which this registry does not serve, so fall back to a fresh resolve.
    (cd "$HOME" && cargo install --quiet --locked "$1" --version "=$2") || {
        log "cargo install --locked $1 failed; retrying without --locked"
        (cd "$HOME" && cargo install --quiet "$1" --version "=$2")
    }
}

setup_tools() {
    local v="${WASM_BINDGEN_VERSION:-}"
    if [ -z "$v" ] && [ -f "$CARGO_LOCK" ]; then
        v=$(awk '$0=="name = \"wasm-bindgen\"" {getline; gsub(/"/, "", $3); print $3; exit}' "$CARGO_LOCK")
    fi
    v=${v:-0.2.130}
    if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" = "$v" ]; then
        log "wasm-bindgen $v already installed"
    else
        log "cargo install wasm-bindgen-cli $v (~5 min on 2 cores)"
        cargo_install wasm-bindgen-cli "$v"
    fi

    if [ -n "$WASM_PACK_VERSION" ]; then
        if [ "$(wasm-pack --version 2>/dev/null | awk '{print $2}')" = "$WASM_PACK_VERSION" ]; then
            log "wasm-pack $WASM_PACK_VERSION already installed"
        else
            log "cargo install wasm-pack $WASM_PACK_VERSION (~4 min on 2 cores)"
            cargo_install wasm-pack "$WASM_PACK_VERSION"
        fi
    fi

    # wasm-opt: Debian's binaryen (108) cannot parse current rustc/wasm-bindgen
    # output (table.fill, "invalid code after misc prefix: 17"); npm's binaryen
    # package runs wasm-opt on node.  /usr/local/bin precedes /usr/bin on PATH.
    if [ -n "$BINARYEN_NPM_VERSION" ]; then
        local wo="$WASM_TOOLS_DIR/node_modules/.bin/wasm-opt"
        if [ -x "$wo" ] && "$wo" --version 2>/dev/null | grep -q "version ${BINARYEN_NPM_VERSION%%.*}"; then
            log "wasm-opt (npm binaryen $BINARYEN_NPM_VERSION) already installed"
        else
            command -v npm >/dev/null || die "npm not found (needed for wasm-opt)"
            log "npm install binaryen@$BINARYEN_NPM_VERSION into $WASM_TOOLS_DIR"
            mkdir -p "$WASM_TOOLS_DIR"
            npm install --prefix "$WASM_TOOLS_DIR" --no-audit --no-fund --loglevel=error \
                "binaryen@$BINARYEN_NPM_VERSION" >/dev/null
        fi
        ln -sfn "$wo" /usr/local/bin/wasm-opt
        if [ -e /usr/bin/wasm-opt ]; then
            log "note: /usr/bin/wasm-opt ($(/usr/bin/wasm-opt --version)) is too old; make sure /usr/local/bin comes first on PATH"
        fi
    fi
}

# --------------------------------------------------------------------- main --
toolchain=""
if rustup_has_target; then
    toolchain=$(rustup show active-toolchain | awk '{print $1; exit}')
    log "rustup toolchain '$toolchain' already has $TARGET: skipping the Debian toolchain"
else
    setup_debian_toolchain
    toolchain=$WASM_TC_NAME
fi
setup_tools

mkdir -p "$(dirname "$WASM_ENV_FILE")"
printf 'WASM_TOOLCHAIN=%s\n' "$toolchain" > "$WASM_ENV_FILE"
log "done: wrote $WASM_ENV_FILE (WASM_TOOLCHAIN=$toolchain)"
log "use: cargo +$toolchain build --release --target $TARGET"
log "     RUSTUP_TOOLCHAIN=$toolchain wasm-pack build --target web --release"
