#!/usr/bin/env bash
# Builds retrieval.wasm (reactor ABI, no libc) from retrieval.c and the C SDK (functions/sdk/c).
# Set OUT to write the module somewhere else: OUT=/tmp/x.wasm ./build.sh
# Exits 2 when a tool is missing. Needs clang and lld (apt-get install -y clang lld).
set -euo pipefail

# A relative OUT is taken relative to the caller's directory, not the script's.
if [ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ]; then
    OUT="$PWD/$OUT"
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

missing() {
    echo "build.sh: $1 not found. On Debian/Ubuntu install: apt-get install -y clang lld" >&2
    exit 2
}
command -v clang >/dev/null 2>&1 || missing "clang"
# the linker clang itself would run (wasm-ld, or wasm-ld-NN next to clang)
command -v "$(clang --target=wasm32 --print-prog-name=wasm-ld)" >/dev/null 2>&1 \
    || missing "wasm-ld (lld)"

# The C SDK: this checkout's, or the installed edgefn's (a copy of this folder elsewhere).
SDK="../../sdk/c"
if [ ! -f "$SDK/edgefn.h" ]; then
    SDK="$("${PYTHON:-python3}" -c 'import edgefn_sdk; print(edgefn_sdk.C_HEADER.parent)' \
        2>/dev/null)" || {
        echo "build.sh: edgefn.h not found: not in a checkout, and \`import edgefn_sdk\` fails" \
             "(set PYTHON to the python that has edgefn installed)" >&2
        exit 2
    }
fi

OUT="${OUT:-retrieval.wasm}"
clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -Wl,--strip-all -Wl,--allow-undefined \
  -I "$SDK" -o "$OUT" retrieval.c
echo "built $OUT ($(wc -c <"$OUT") bytes)"
