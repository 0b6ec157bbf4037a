"""`edgefn dashboard`: a one-time login URL for a running PoP's live dashboard
(served by its admin listener, loopback only)."""

from __future__ import annotations

import argparse
import json
import sys


def login_url(data: str) -> str:
    """``http://ADMIN/dashboard?token=T``. Raises `AdminError` if the admin API
    refuses (an API key: the dashboard takes the admin token), `Failure` if no PoP runs."""
    from runtime.admin.client import AdminClient

    client = AdminClient(data, timeout=30)
    answer = client.request("POST", "/v1/dashboard/login")
    return f"http://{client.info.admin}{answer['path']}"


def dashboard_command(args: argparse.Namespace) -> None:
    """Raises as `login_url` does."""
    url = login_url(args.data)
    if args.json:
        print(json.dumps({"url": url, "expires_in": 60}))
    else:
        print(url)  # alone on stdout: `curl "$(edgefn dashboard)"`, `xdg-open "$(...)"`
        print("(the login token works once, within 60 s)", file=sys.stderr)
    if args.open:
        import webbrowser

        webbrowser.open(url)
