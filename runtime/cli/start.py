"""`edgefn serve` and `edgefn dev`: the system libstdc++ is made global before
anything imports usearch (`edgefn_core.process.load_system_libstdcxx`), so the
C++ libraries a PoP loads later (libmodsecurity for the WAF, onnxruntime) bind
to it and not to usearch's copy."""

from __future__ import annotations

import argparse

from edgefn_core.process import load_system_libstdcxx


def serve_command(args: argparse.Namespace) -> None:
    load_system_libstdcxx()
    from runtime.cli.dev import serve_command as serve

    serve(args)


def dev_command(args: argparse.Namespace) -> None:
    load_system_libstdcxx()
    from runtime.cli.dev import dev_command as dev

    dev(args)
