#!/usr/bin/env bash
# Builds ai.wasm (reactor ABI, no libc). Needs clang and lld (apt-get install -y clang lld).
set -euo pipefail
cd "$(dirname "$0")"
command -v clang >/dev/null || { echo "clang not found: apt-get install -y clang lld" >&2; exit 2; }
clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -Wl,--strip-all -Wl,--allow-undefined \
  -o "${OUT:-ai.wasm}" ai.c
