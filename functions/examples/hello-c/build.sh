#!/usr/bin/env bash
# Builds hello.wasm (a wasm32-wasi command module) from hello.c.
# Set OUT to write the module somewhere else: OUT=/tmp/x.wasm ./build.sh
set -euo pipefail

# A relative OUT is taken relative to the caller's directory, not the script's.
if [ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ]; then
    OUT="$PWD/$OUT"
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

missing() {
    echo "build.sh: $1 not found." >&2
    echo "On Debian/Ubuntu install: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32" >&2
    exit 2
}

command -v clang >/dev/null 2>&1 || missing "clang"
command -v wasm-ld >/dev/null 2>&1 || command -v wasm-ld-14 >/dev/null 2>&1 \
    || ls /usr/lib/llvm-*/bin/wasm-ld >/dev/null 2>&1 || missing "wasm-ld (lld)"
# Debian's wasi-libc installs headers in /usr/include/wasm32-wasi and
# libraries in /usr/lib/wasm32-wasi, so the sysroot is /usr.
[ -f /usr/include/wasm32-wasi/stdio.h ] && [ -f /usr/lib/wasm32-wasi/libc.a ] \
    || missing "the wasi-libc sysroot (/usr/include/wasm32-wasi, /usr/lib/wasm32-wasi)"
# libclang-rt-dev-wasm32 provides the compiler-rt builtins wasm-ld links in.
[ -f "$(clang --target=wasm32-wasi --sysroot=/usr -print-libgcc-file-name)" ] \
    || missing "the wasm32 compiler-rt builtins (libclang_rt.builtins-wasm32.a)"

OUT="${OUT:-hello.wasm}"
clang --target=wasm32-wasi --sysroot=/usr -O2 -Wl,--strip-all -o "$OUT" hello.c
echo "built $OUT ($(wc -c <"$OUT") bytes)"
