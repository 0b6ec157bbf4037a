"""The 503 ``starting`` a PoP answers while ``edgefn dev`` deploys its folders,
kept in DATA/dev-starting.json so that a worker started again meanwhile answers
it too (``workers = N``), not a 404 until the deploys end.

The admin worker saves it (`save`) before it tells the other workers; a worker
reads it (`load`) once its control socket is bound, so it either gets the
message or reads what was saved before it was sent. The parent clears it
(`clear`) before it starts the workers: one left by a PoP that was killed while
its dev session deployed says nothing about the next one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

log = logging.getLogger("edgefn.workers")
NAME = "dev-starting.json"


def save(data: Path, why: str | None) -> None:
    """Record `why` (None: remove the record). A record that cannot be written is
    logged, not raised: the workers running are told anyway (only one started
    again would miss it)."""
    path = data / NAME
    try:
        if why is None:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f".{NAME}.{os.getpid()}")
        tmp.write_text(json.dumps({"why": why}))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot record edgefn dev's 503 for workers started again in %s: %s",
                    path, e)


def load(data: Path) -> str | None:
    """What `save` recorded; None when nothing is (or the record cannot be read)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        why = json.loads((data / NAME).read_text()).get("why")
        return why if isinstance(why, str) else None
    return None


def clear(data: Path) -> None:
    """Remove the record. Raises OSError (other than a missing file)."""
    (data / NAME).unlink(missing_ok=True)
