"""A secret kept in a file of its own: created once (mode 0600, never overwritten),
read every time after. The admin token and a topology's shared secret live so."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], str]) -> str:
    """The secret in `path`, written from `make()` first if the file does not exist
    (its folder is created too). The file appears whole or not at all (written
    aside, then linked into place: a process starting beside the writer read an
    empty one), and the first writer's secret is every process's. Raises OSError if
    it cannot be read or written."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(make())
            with contextlib.suppress(FileExistsError):  # another process's stands
                os.link(aside, path)  # never replaces
        finally:
            aside.unlink(missing_ok=True)
    return path.read_text().strip()
