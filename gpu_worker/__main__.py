"""``python -m gpu_worker --socket PATH [--config FILE]`` (also ``edgefn gpu-worker``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from edgefn_core.errors import EdgefnError

from . import config, server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="edgefn gpu-worker",
                                 description="Run the model worker on a Unix socket.")
    ap.add_argument("--socket", required=True, help="Unix socket path to listen on")
    ap.add_argument("--config", help="worker config (TOML); default: the packaged models")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s gpu-worker %(levelname)s %(message)s")
    try:
        cfg = config.load(args.config)
        try:
            import uvloop

            runner = uvloop.run
        except ImportError:  # pragma: no cover - uvloop is a dependency
            runner = asyncio.run
        runner(server.run(cfg, args.socket))
    except EdgefnError as e:
        print(f"edgefn gpu-worker: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
