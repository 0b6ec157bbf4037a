#!/usr/bin/env bash
# Builds counter.wasm from counter.ts and the AssemblyScript SDK (functions/sdk/assemblyscript)
# with the AssemblyScript compiler of version ASC_VERSION, the one the committed module was
# built with (`npm install assemblyscript@0.27.37`; `make test` installs it under .venv/tools).
# The compiler used: $ASC if set, else .venv/tools' (from `make test`), else `npx asc`.
# Set OUT to write the module somewhere else: OUT=/tmp/x.wasm ./build.sh
# Exits 2 when the compiler is missing or another version.
set -euo pipefail
ASC_VERSION=0.27.37

# A relative OUT is taken relative to the caller's directory, not the script's.
if [ -n "${OUT:-}" ] && [ "${OUT#/}" = "$OUT" ]; then
    OUT="$PWD/$OUT"
fi
cd "$(dirname "${BASH_SOURCE[0]}")"

missing() {
    echo "build.sh: $1; install it with: npm install assemblyscript@$ASC_VERSION" >&2
    exit 2
}
if [ -n "${ASC:-}" ]; then
    asc=("$ASC")
elif [ -x ../../../.venv/tools/node_modules/.bin/asc ]; then
    asc=(../../../.venv/tools/node_modules/.bin/asc)
elif command -v npx >/dev/null 2>&1; then
    asc=(npx --no-install asc)
else
    missing "the AssemblyScript compiler (asc) not found, nor npx (Node.js and npm)"
fi
version=$("${asc[@]}" --version 2>/dev/null) || missing "the AssemblyScript compiler (asc) not found"
[ "$version" = "Version $ASC_VERSION" ] \
    || missing "asc $ASC_VERSION wanted, found '${version}' (${asc[*]})"

# The AssemblyScript SDK: this checkout's, or the installed edgefn's (a copy of this
# folder elsewhere: counter.ts imports it by a relative path, so the build reads a copy
# of counter.ts beside a copy of the SDK).
SRC=counter.ts
if [ ! -f ../../sdk/assemblyscript/edgefn.ts ]; then
    SDK_TS="$("${PYTHON:-python3}" -c 'import edgefn_sdk; print(edgefn_sdk.ASSEMBLYSCRIPT)' \
        2>/dev/null)" || {
        echo "build.sh: edgefn.ts not found: not in a checkout, and \`import edgefn_sdk\` fails" \
             "(set PYTHON to the python that has edgefn installed)" >&2
        exit 2
    }
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    cp "$SDK_TS" "$tmp/edgefn.ts"
    sed 's#"../../sdk/assemblyscript/edgefn"#"./edgefn"#' counter.ts >"$tmp/counter.ts"
    SRC="$tmp/counter.ts"
fi

OUT="${OUT:-counter.wasm}"
"${asc[@]}" "$SRC" -O3 --runtime stub --use abort= -o "$OUT"
echo "built $OUT ($(wc -c <"$OUT") bytes)"
