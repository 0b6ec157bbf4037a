#!/usr/bin/env bash
# Builds counter.wasm with AssemblyScript (npm install assemblyscript@0.27; uses npx).
set -euo pipefail
cd "$(dirname "$0")"
command -v npx >/dev/null || { echo "npx not found: install Node.js and npm" >&2; exit 2; }
npx --no-install asc counter.ts -O3 --runtime stub --use abort= -o "${OUT:-counter.wasm}"
