"""Talks to a running PoP's admin API, found through its data dir."""

from __future__ import annotations

import fcntl
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import AdminError, Failure


class PopInfo(msgspec.Struct):
    """What a running PoP writes to DATA/pop.json so the CLI can find it."""

    pid: int
    public: str
    admin: str


class AdminClient:
    def __init__(self, data_dir: str | Path, timeout: float = 120.0) -> None:
        """Authenticates with the admin token, or with the API key in
        ``EDGEFN_API_KEY`` when set (its ``admin:*`` scopes decide what it may do).
        Raises `Failure` (code ``pop_not_running``) if no PoP runs on `data_dir`."""
        data = Path(data_dir)
        held = running(data)
        try:
            self.info = msgspec.json.decode((data / "pop.json").read_bytes(), type=PopInfo)
            key = os.environ.get("EDGEFN_API_KEY")
            self.token = key or (data / "admin.token").read_text().strip()
        except (OSError, msgspec.DecodeError) as e:
            if held:  # running, but not (yet) announced
                raise Failure("pop_unreachable", 503, f"a PoP holds data dir {data} but "
                              f"cannot be reached through it ({e}); it may still be "
                              "starting") from None
            raise Failure("pop_not_running", 503, f"no PoP is running with data dir {data} "
                          "(start one with `edgefn serve` or `make dev`, or pass --data)") \
                from None
        if not held:  # a PoP killed -9 leaves its pop.json behind
            raise Failure("pop_unreachable", 503, f"cannot reach the PoP's admin API at "
                          f"{self.info.admin}: no PoP runs on data dir {data} any more (the "
                          "one that wrote its pop.json is gone: killed?)")
        self.timeout = timeout

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> Any:
        """Raises `AdminError` for an error answer, `Failure` (code ``pop_unreachable``)
        if the PoP cannot be reached."""
        conn, resp = self._send(method, path, body, headers, self.timeout)
        try:
            raw = resp.read()
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise self._lost(method, path, e) from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise _refused(resp.status, raw, raw.decode("utf-8", "replace"))
        return json.loads(raw or b"{}")

    def stream(self, path: str) -> Iterator[bytes]:
        """The lines of a streamed answer (SSE), as they come, until the PoP ends it.
        Raises `AdminError` for an error answer, `Failure` (``pop_unreachable``)."""
        conn, resp = self._send("GET", path, timeout=None)
        try:
            if resp.status >= 400:
                raise _refused(resp.status, resp.read(), "")
            while line := resp.readline():
                yield line
        finally:
            conn.close()

    def metrics(self) -> str:
        """The PoP's Prometheus exposition (``GET /metrics``). Raises `AdminError`,
        `Failure` as `request` does."""
        conn, resp = self._send("GET", "/metrics", timeout=self.timeout)
        try:
            body = resp.read()
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            raise self._lost("GET", "/metrics", e) from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise _refused(resp.status, body, f"GET /metrics answered {resp.status}")
        return body.decode()

    def _send(self, method: str, path: str, body: bytes = b"",
              headers: dict[str, str] | None = None, timeout: float | None = None
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """The connection (the caller closes it) and the head of its answer.
        Raises `Failure` (``pop_unreachable``)."""
        host, port = self.info.admin.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            conn.connect()
        except OSError as e:
            conn.close()
            raise self._unreachable(e) from None
        try:
            conn.request(method, path, body, {"authorization": f"Bearer {self.token}",
                                              **(headers or {})})
            return conn, conn.getresponse()
        except (ConnectionError, OSError, http.client.HTTPException) as e:
            conn.close()
            raise self._lost(method, path, e) from None

    def _unreachable(self, e: OSError) -> Failure:
        return Failure("pop_unreachable", 503, "cannot reach the PoP's admin API at "
                       f"{self.info.admin}: {e}")

    def _lost(self, method: str, path: str, e: Exception) -> Failure:
        """The PoP was reached, then the connection went before its whole answer (it
        was said "cannot reach", of a deploy the PoP had made)."""
        if isinstance(e, TimeoutError):
            said = (f"the PoP's admin API at {self.info.admin} did not answer {method} {path} "
                    f"in time ({e or 'timed out'})")
        else:
            said = (f"the connection to the PoP's admin API at {self.info.admin} was lost "
                    f"during {method} {path} ({e or type(e).__name__}): the PoP may have "
                    "restarted")
        if method not in ("GET", "HEAD"):
            said += "; what was asked may have been done: check (`edgefn ls`, `edgefn versions`)"
        return Failure("pop_unreachable", 503, said)

    def deploy(self, directory: str | Path, replaces: str | None = None) -> dict[str, Any]:
        """Pack and deploy a function folder (`replaces`: a function it takes over
        from, `Registry.deploy`). Raises `DeployError` or `ManifestError` for a folder
        that cannot be packed, `AdminError` if the PoP rejects it."""
        from runtime.functions import deploys  # only deploys need it (and its imports)

        package = deploys.to_tar(deploys.pack_dir(directory))
        headers = {"x-edgefn-source": str(directory).rstrip("/")}
        if replaces is not None:
            headers["x-edgefn-replaces"] = replaces
        result: dict[str, Any] = self.request("POST", "/v1/deploy", package, headers)
        return result


def _refused(status: int, body: bytes, fallback: str) -> AdminError:
    """The PoP's error answer (``{"error": {"kind", "message"}}``) as an `AdminError`;
    `fallback` is its message when the body does not say."""
    try:
        err = json.loads(body or b"{}").get("error", {})
    except (ValueError, AttributeError):
        err = {}
    return AdminError(err.get("kind", "error"), status, err.get("message", fallback))


def running(data_dir: str | Path) -> bool:
    """Whether a PoP runs on `data_dir` now: one holds DATA/pop.lock (the kernel drops
    its flock when the process dies, whatever it left in the data dir)."""
    try:
        fd = os.open(Path(data_dir) / "pop.lock", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no such file, or not a folder: no PoP ever ran there
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases a lock this took
    return False

