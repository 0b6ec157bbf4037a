"""The `edgefn` command: parse the command line, configure logging, run the
command's handler, and turn a failure into one line on stderr (a JSON object with
--json) and an exit status. Handlers are imported only when their command runs."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from edgefn_core.errors import EdgefnError, Interrupted
from runtime.cli.parser import UsageError, build

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what `yes | head -1` reports for `yes`


def main(argv: list[str] | None = None) -> int:
    """Run one `edgefn` command and return its exit status. Raises SystemExit for
    --help and --version; an unexpected exception (a bug) keeps its traceback."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build().parse_args(argv)
    except UsageError as e:
        return fail("usage", f"{e} (see `{e.prog} --help`)", "--json" in argv, EXIT_USAGE)
    if args.logs:
        from runtime.cli.logs import configure

        configure(args.verbose)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Call the command's handler; its return value (None: 0) is the exit status."""
    try:
        status = handler(args.handler)(args)
        sys.stdout.flush()  # here, so a closed pipe is seen here and not at exit
    except Interrupted as e:  # SIGTERM/SIGINT while the PoP started: 128 + its number,
        name = signal.Signals(e.signum).name  # as a shell reports a process its signal ended
        print(f"edgefn: {name} while starting; what had started is stopped", file=sys.stderr)
        return 128 + e.signum
    except EdgefnError as e:  # a command line only the command could judge: still usage
        return fail(e.code, str(e), args.json, EXIT_USAGE if e.code == "usage" else EXIT_ERROR)
    except BrokenPipeError:
        return stdout_closed()
    except (NotADirectoryError, FileExistsError, PermissionError, IsADirectoryError,
            FileNotFoundError) as e:  # the machine's say (a --data that is a file): one line
        where = f"{e.filename}: " if e.filename else ""
        return fail("os_error", f"{where}{e.strerror or e}", args.json, EXIT_ERROR)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return int(status or 0)


def handler(spec: str) -> Callable[[argparse.Namespace], Any]:
    """The function a ``"module:function"`` spec names (imports the module)."""
    module, _, name = spec.partition(":")
    func: Callable[[argparse.Namespace], Any] = getattr(importlib.import_module(module), name)
    return func


def fail(code: str, message: str, as_json: bool, status: int) -> int:
    """Report an error on stderr: ``edgefn: MESSAGE``, or with `as_json`
    ``{"error": {"code": CODE, "message": MESSAGE}}``; returns `status`."""
    if as_json:
        import json

        print(json.dumps({"error": {"code": code, "message": message}}), file=sys.stderr)
    else:
        print(message if code == "usage" else f"edgefn: {message}", file=sys.stderr)
    return status


def stdout_closed() -> int:
    """The reader of stdout went away (`edgefn ls | head -1`): stop quietly, as
    Unix tools do, and point stdout at /dev/null so the exit flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())
