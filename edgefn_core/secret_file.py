"""A secret kept in a file of its own: created once (mode 0600, never overwritten),
read every time after. The admin token and a topology's shared secret live so."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def secret_file(path: Path, make: Callable[[], str]) -> str:
    """The secret in `path`, written from `make()` first if the file does not exist
    (its folder is created too). Raises OSError if it cannot be read or written."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it first: read theirs
            return path.read_text().strip()
        with os.fdopen(fd, "w") as f:
            f.write(make())
    return path.read_text().strip()
