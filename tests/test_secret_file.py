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


def test_processes_starting_together_all_read_one_whole_secret(tmp_path: Path) -> None:
    """The file was created empty, then written: a worker reading between the two
    got "" (and fell back to a secret of its own)."""
    import subprocess
    import sys

    from tests.support import ROOT

    path = tmp_path / "bots.secret"
    probe = ("import sys, secrets\nfrom pathlib import Path\n"
             "from edgefn_core.secret_file import secret_file\n"
             "print(secret_file(Path(sys.argv[1]), lambda: secrets.token_hex(32)))\n")
    procs = [subprocess.Popen([sys.executable, "-c", probe, str(path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]
    read = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(read) == 1 and len(read.pop()) == 64
    assert not list(tmp_path.glob(".*.tmp"))  # no file written aside is left
