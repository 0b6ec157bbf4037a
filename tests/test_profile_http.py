"""bench/profile_http.py's folding of `perf script` output: which library, symbol and
Python frame a sample is counted under, and what a frame called. (Its recording needs
perf and a loaded PoP: run by hand; its import is test_bench_imports'.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT

spec = importlib.util.spec_from_file_location("profile_http", ROOT / "bench" / "profile_http.py")
assert spec is not None and spec.loader is not None
profile_http = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = profile_http
spec.loader.exec_module(profile_http)

TREE = "/src/edgefn"
# three samples as `perf script -F comm,tid,ip,sym,dso` prints them: the sampled frame
# first, callers after; an inlined frame names no library of its own
SCRIPT = f"""python 100
\t    7f01 Py_INCREF (inlined)
\t    7f01 _PyEval_EvalFrameDefault+0x1a2 (/usr/lib/libpython3.13.so.1.0)
\t    7f99 py::HttpProtocol._lane:{TREE}/runtime/net/protocol.py (/tmp/perf-100.map)
\t    7faa py::HttpProtocol.data_received:{TREE}/runtime/net/protocol.py (/tmp/perf-100.map)

python 100
\tffffffff81 tcp_sendmsg_locked+0x20 ([kernel.kallsyms])
\t    1234 __GI___libc_write (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t    7f77 py::HttpProtocol._flush:{TREE}/runtime/net/protocol.py (/tmp/perf-100.map)

python 100
\t    5555 wasmtime_store_delete+0x10 (/venv/wasmtime/_libwasmtime.so)
\t    6666 edgefn_reactor_call+0x9 (/cache/reactor-1.so)
\t    7777 Lane_serve (/cache/lane-1.so)
\t    7f55 py::NativeLane.serve:{TREE}/runtime/pipeline/lane.py (/tmp/perf-100.map)
"""


def folded() -> Any:
    samples = profile_http.parse_script(SCRIPT, Path(TREE))
    return profile_http.Profile("t", samples, us_per_request=9.0, rps=1.0)


def test_each_sample_is_its_frames_from_the_sampled_one_out() -> None:
    p = folded()
    assert [len(s) for s in p.samples] == [4, 3, 4]
    assert p.samples[1][0] == ("tcp_sendmsg_locked", "[kernel.kallsyms]")  # offset gone
    assert p.samples[0][2] == ("py::HttpProtocol._lane:runtime/net/protocol.py", "perf-100.map")


def test_an_inlined_sample_counts_under_its_callers_library() -> None:
    assert profile_http.by_library(folded()) == {
        "libpython3.13.so.1.0": 1, "[kernel.kallsyms]": 1, "_libwasmtime.so": 1}
    assert profile_http.by_symbol(folded())["Py_INCREF"] == 1


def test_a_sample_counts_under_its_innermost_python_frame() -> None:
    assert profile_http.by_python_frame(folded()) == {
        "py::HttpProtocol._lane:runtime/net/protocol.py": 1,
        "py::HttpProtocol._flush:runtime/net/protocol.py": 1,
        "py::NativeLane.serve:runtime/pipeline/lane.py": 1}


def test_under_splits_a_frame_by_what_it_called_and_costs_are_shares_of_a_request() -> None:
    p = folded()
    n, below = profile_http.under(p, re.compile("edgefn_reactor_call"))
    assert (n, below) == (1, {"wasmtime_store_delete": 1})
    n, below = profile_http.under(p, re.compile("wasmtime_store_delete"))
    assert below == {"wasmtime_store_delete (self)": 1}
    assert p.us(n) == 3.0  # one sample of three, of 9 us a request
    assert profile_http.under(p, re.compile("nothing_like_this")) == (0, {})
