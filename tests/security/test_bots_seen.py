"""What the bot manager remembers for single use: solved challenges and Web Bot Auth
signatures, within a time to live, failing closed when full; `SharedSeen` does it
for every process of a PoP (a real LMDB file, a second process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runtime.security.bots.seen import SeenSet, SharedSeen
from tests.support import ROOT


@pytest.mark.parametrize("shared", [False, True])
def test_a_value_is_claimed_once_within_its_ttl_and_never_past_capacity(
        shared: bool, tmp_path: Path) -> None:
    s = SharedSeen(tmp_path / "seen", ttl=10, capacity=2) if shared else SeenSet(10, 2)
    assert s.claim(b"a", 100) is None and s.claim(b"a", 105) == "seen"
    assert s.claim(b"b", 105) is None
    assert s.claim(b"c", 105) == "full"  # two alive: it refuses, it forgets none
    assert s.claim(b"c", 111) is None  # a expired: room again
    assert s.claim(b"a", 111) == "full"  # b and c alive
    assert s.claim(b"a", 116) is None and s.claim(b"a", 117) == "seen"  # b expired
    assert s.seen(b"c", 117) and not s.seen(b"b", 117) and not s.seen(b"z", 117)


def test_another_process_sees_what_one_claimed(tmp_path: Path) -> None:
    path = tmp_path / "seen"
    s = SharedSeen(path, ttl=60)
    assert s.claim(b"signature-1", 1000.0) is None
    probe = ("import sys\nfrom pathlib import Path\n"
             "from runtime.security.bots.seen import SharedSeen\n"
             "s = SharedSeen(Path(sys.argv[1]), ttl=60)\n"
             "print(s.claim(b'signature-1', 1001.0), s.claim(b'signature-2', 1001.0))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(path)], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["seen", "None"]
    assert s.claim(b"signature-2", 1002.0) == "seen"
    s.close()
