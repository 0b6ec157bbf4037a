"""A secret file is made once, private to its owner, and read back after."""

import stat
from pathlib import Path

from edgefn_core.secret_file import secret_file


def test_made_once_with_mode_0600_then_read(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "token"
    made = []

    def make() -> str:
        made.append(1)
        return f"s3cret-{len(made)}"

    assert secret_file(path, make) == "s3cret-1"
    assert secret_file(path, make) == "s3cret-1" and made == [1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
