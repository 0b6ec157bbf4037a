"""`edgefn keys create --expires`: a duration (90m, 12h, 30d) or an ISO 8601 time, as
the time it stops working."""

from __future__ import annotations

import re
import time
from datetime import datetime

DURATION = re.compile(r"^(\d+)([mhd])$")
MAX_EXPIRY_S = 100 * 365 * 86400


def expires_at(text: str) -> float:
    """The Unix time `text` names. Raises ValueError saying what is wrong (in the
    past, more than 100 years away, neither a duration nor an ISO 8601 time)."""
    m = DURATION.match(text)
    if m:
        seconds = int(m[1]) * {"m": 60, "h": 3600, "d": 86400}[m[2]]
        if not 0 < seconds <= MAX_EXPIRY_S:  # 0: a key expired when it is made
            raise ValueError(f"expected a duration from 1m to 100 years, got {text!r}")
        return time.time() + seconds
    try:
        when = datetime.fromisoformat(text)
        if when.tzinfo is None:
            when = when.astimezone()
        at = when.timestamp()
    except (ValueError, OverflowError):  # not a time, or one past year 9999 in UTC
        raise ValueError(f"expected a duration (90m, 12h, 30d) or an ISO 8601 time, got "
                         f"{text!r}") from None
    if at <= time.time():
        raise ValueError(f"{text} is in the past")
    if at - time.time() > MAX_EXPIRY_S:
        raise ValueError(f"{text} is more than 100 years away")
    return at
