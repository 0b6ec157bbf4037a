#!/usr/bin/env bash
# Builds sandbox.wasm (a wasm32-wasi command) from sandbox.c; OUT writes it elsewhere.
# Exits 2 when a tool is missing (the test that runs it tells that apart from a failed build).
set -euo pipefail
if [ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ]; then
    OUT="$PWD/$OUT"
fi
cd "$(dirname "${BASH_SOURCE[0]}")"
missing() {
    echo "build.sh: $1 not found; apt-get install -y clang lld wasi-libc libclang-rt-dev-wasm32" >&2
    exit 2
}
command -v clang >/dev/null 2>&1 || missing "clang"
command -v "$(clang --target=wasm32 --print-prog-name=wasm-ld)" >/dev/null 2>&1 || missing "wasm-ld (lld)"
[ -f /usr/lib/wasm32-wasi/libc.a ] || missing "the wasi-libc sysroot (/usr/lib/wasm32-wasi)"
[ -f "$(clang --target=wasm32-wasi --sysroot=/usr -print-libgcc-file-name)" ] \
    || missing "the wasm32 compiler-rt builtins (libclang_rt.builtins-wasm32.a)"
clang --target=wasm32-wasi --sysroot=/usr -O2 -Wl,--strip-all -o "${OUT:-sandbox.wasm}" sandbox.c
