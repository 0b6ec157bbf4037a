"""`edgefn serve` and `edgefn dev`: run a PoP in the foreground; in dev mode deploy
every function folder under a directory and redeploy one when its files change."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import msgspec
import uvloop

from edgefn_core.errors import (
    AdminError,
    DeployError,
    Failure,
    InvalidConfig,
    ManifestError,
    NotFound,
)
from runtime import config
from runtime.admin.client import AdminClient
from runtime.app import StopSignals, running_pop
from runtime.config import PopConfig
from runtime.functions import deploys, manifest
from runtime.functions.registry import DeployResult, Registry
from runtime.pop import PoP

log = logging.getLogger("edgefn.dev")
POLL_SECONDS = 0.5
GONE_SECONDS = 5.0  # a folder gone this long is removed (not one moved away and back)
# errors binding a listener, reported in one line rather than a traceback
LISTEN_ERRORS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


def serve_command(args: argparse.Namespace) -> None:
    """`edgefn serve`. Raises `EdgefnError` if the PoP cannot start."""
    run(args, None)


def dev_command(args: argparse.Namespace) -> None:
    """`edgefn dev DIR`. Raises `NotFound` if DIR is not a directory, `EdgefnError`
    if the PoP cannot start."""
    if not Path(args.dir).is_dir():
        raise NotFound(f"{args.dir}: no such directory (`edgefn dev DIR` deploys the "
                       "function folders under DIR)")
    run(args, args.dir)


def run(args: argparse.Namespace, dev_dir: str | None) -> None:
    """Run a PoP from the command line's options until SIGINT/SIGTERM. Raises
    `Failure` (code ``cannot_listen``) if a listener cannot bind its address."""
    cfg = pop_config(args)
    for listener, flag in ((cfg.public, "--port"), (cfg.admin, "--admin-port")):
        check_listen(listener.host, listener.port, flag)  # before the model worker starts
    try:
        uvloop.run(serve(cfg, dev_dir) if cfg.worker_count() == 1
                   else serve_workers(cfg, getattr(args, "verbose", 0), dev_dir))
    except OSError as e:
        if e.errno not in LISTEN_ERRORS:
            raise
        raise cannot_listen(e.strerror or str(e), e.errno) from None
    except InvalidConfig as e:  # the parts that build the PoP call its config "pop.toml"
        if e.field == "data" and cfg.data == args.data:  # not the file's value
            given = getattr(args, "data_given", False) or not os.environ.get("EDGEFN_DATA")
            raise InvalidConfig("--data" if given else "$EDGEFN_DATA", e.reason) from None
        config_file = getattr(args, "config", None)
        if config_file is None or not e.file.startswith("pop.toml") or \
                isinstance(e, ManifestError):
            raise
        raise InvalidConfig(config_file + e.file.removeprefix("pop.toml"), e.reason,
                            e.field) from None


def check_listen(host: str, port: int, flag: str = "--port") -> None:
    """Bind `host`:`port` for a moment, as the server will (SO_REUSEADDR). Raises
    `Failure` (code ``cannot_listen``, its hint naming `flag`, the option that sets
    the port) if that fails now; the real bind can still fail later, and is
    reported the same way."""
    if port == 0:
        return
    try:
        for family, kind, proto, _, addr in socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(addr)
    except OSError as e:
        if e.errno in LISTEN_ERRORS:
            raise cannot_listen(f"cannot listen on {host}:{port}: "
                                f"{os.strerror(e.errno).lower()}", e.errno, flag) from None


def cannot_listen(reason: str, code: int | None = errno.EADDRINUSE,
                  flag: str = "--port") -> Failure:
    """The `Failure` for a listener that cannot bind (`code`: its errno), with the
    hint that fits it."""
    if code == errno.EADDRNOTAVAIL:
        hint = "no interface of this machine has that address: check --host"
    elif code == errno.EACCES:
        hint = f"a port below 1024 needs more privileges: choose another {flag}"
    else:
        hint = f"is another PoP running? choose another {flag}, or 0 for any"
    return Failure("cannot_listen", 409, f"cannot start the PoP: {reason} ({hint})")


def pop_config(args: argparse.Namespace) -> PopConfig:
    """The PoP config from --config and the flags that override it; the data dir is
    --data, else the file's ``data``, else $EDGEFN_DATA, else ./.edgefn (`args.data`
    is one of the last two when --data is not given). Raises `InvalidConfig`, or a
    usage `Failure` for a flag's bad value."""
    data = args.data if getattr(args, "data_given", False) else None
    try:
        return config.load(args.config, under={"data": args.data}, data=data, **{
            "public.host": args.host, "public.port": args.port, "admin.port": args.admin_port,
            "ai.enabled": False if args.no_ai else None, "ai.worker_config": args.ai_config,
            "ai.socket": args.ai_socket,
            "insecure_python": True if args.insecure_python else None})
    except InvalidConfig as e:  # a flag's value: named as the flag ("<defaults>: field ...")
        flag = FLAGS.get(e.field or "")
        if flag is None or getattr(args, flag[0]) is None:
            raise
        raise Failure("usage", 400, f"{args.prog_}: argument {flag[1]}: {e.reason} "
                      f"(see `{args.prog_} --help`)") from None


# config fields a flag of `serve` / `dev` sets: (its argparse dest, the flag)
FLAGS = {"public.host": ("host", "--host"), "public.port": ("port", "--port"),
         "admin.port": ("admin_port", "--admin-port"),
         "ai.worker_config": ("ai_config", "--ai-config")}


def function_dirs(root: Path) -> list[Path]:
    """Folders under `root` that hold an edgefn.toml (hidden folders under `root`
    skipped; `root` itself may be inside one)."""
    found = [p.parent for p in root.rglob(manifest.MANIFEST_NAME)]
    return sorted(d for d in found
                  if not any(part.startswith(".") for part in d.relative_to(root).parts))


def snapshot(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Path, mtime and size of each file under `directory` (a file removed while
    it is read is left out; a missing `directory` gives an empty snapshot)."""
    found = []
    for p in directory.rglob("*"):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            st = p.stat()
            if stat.S_ISREG(st.st_mode):
                found.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(sorted(found))


type Deploy = Callable[[Path, str | None], Awaitable[DeployResult]]  # (folder, replaces)
type Remove = Callable[[str], Awaitable[None]]
type Versions = Callable[[str], Awaitable[set[str]]]
type Starting = Callable[[str | None], Awaitable[None]]


class Target(NamedTuple):
    """Where `edgefn dev` deploys: how to deploy a folder, to remove a function, to
    list the versions a function's record holds (none for an unknown one), and to
    say why a path no function serves may soon be served (None: it will not:
    `Registry.starting`)."""

    deploy: Deploy
    remove: Remove
    versions: Versions
    starting: Starting


def in_process(registry: Registry) -> Target:
    """This process's PoP."""
    async def deploy(directory: Path, replaces: str | None) -> DeployResult:
        return await registry.deploy(deploys.pack_dir(directory), str(directory),
                                     replaces=replaces)

    async def versions(name: str) -> set[str]:
        try:
            return {v.version for v in registry.versions(name).versions}
        except NotFound:
            return set()

    async def starting(why: str | None) -> None:
        registry.starting = why

    return Target(deploy, registry.delete, versions, starting)


def through_admin(data: Path) -> Target:
    """The admin API of the PoP on `data` (``workers = N``: the admin worker deploys
    and every other worker follows before it answers)."""
    client = AdminClient(data)

    async def deploy(directory: Path, replaces: str | None) -> DeployResult:
        answer = await asyncio.to_thread(client.deploy, directory, replaces)
        return msgspec.convert(answer, DeployResult)

    async def remove(name: str) -> None:
        await asyncio.to_thread(client.request, "DELETE", f"/v1/functions/{quote(name, safe='')}")

    async def versions(name: str) -> set[str]:
        try:
            rec = await asyncio.to_thread(client.request, "GET",
                                          f"/v1/functions/{quote(name, safe='')}/versions")
        except AdminError as e:
            if e.status == 404:
                return set()
            raise
        return {v["version"] for v in rec["versions"]}

    async def starting(why: str | None) -> None:  # (every worker, before it answers)
        await asyncio.to_thread(client.request, "PUT", "/v1/dev/starting",
                                msgspec.json.encode({"why": why}))

    return Target(deploy, remove, versions, starting)


class Session:
    """What one `edgefn dev` run did to its PoP: the function each folder serves, and
    the versions it added to each function's record. A function holding only those
    is the session's own, and goes with its folder; one with a version from
    elsewhere (`edgefn deploy`, an earlier session) is kept."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.served: dict[Path, str] = {}  # folder -> the function it deployed
        self.made: dict[str, set[str]] = {}  # function -> versions this session added


async def deploy_dir(session: Session, directory: Path) -> bool:
    """Deploy `directory`, keeping `session` up to date: a folder whose manifest now
    names another function replaces the one it deployed, in the same switch (none of
    its requests goes unrouted, and a renamed folder whose code does not load leaves
    it serving), where that one is the session's own; else the old one is kept
    (`release`), and the renamed one may find its routes taken."""
    target, served = session.target, session.served
    try:
        name = manifest.load(directory).name
    except ManifestError as e:
        print(f"  ! {directory}: {e}", flush=True)
        return False
    other = next((d for d, n in served.items() if n == name and d != directory), None)
    if other is not None:  # it would replace the other folder's function
        print(f"  ! {directory}: declares name {name!r}, which {other} serves; not deployed "
              "(give one of them another name)", flush=True)
        return False
    before = served.get(directory)
    replaces = None
    if before is not None and before != name:
        if await owned(session, before):
            replaces = before
        else:
            await release(session, before, f"{directory} is {name!r} now")
            served.pop(directory)
    try:
        known = await target.versions(name)  # a version recorded before is not this session's
        r = await target.deploy(directory, replaces)
    except (ManifestError, DeployError, AdminError) as e:
        print(f"  ! {directory}: {e}", flush=True)
        return False
    if replaces is not None:
        session.made.pop(replaces, None)
        print(f"  removed   {replaces:<16} ({directory} is {name!r} now)", flush=True)
    served[directory] = r.name
    if r.changed and r.version not in known:
        session.made.setdefault(r.name, set()).add(r.version)
    routes = ", ".join((x.get("host") or "") + x["path"] for x in r.routes)
    state = "deployed" if r.changed else "unchanged"
    print(f"  {state:<9} {r.name:<16} {r.version}  {r.abi:<7} {routes}  ({r.took_ms} ms)",
          flush=True)
    return True


def _name(directory: Path) -> str | None:
    """The function name `directory`'s manifest declares, or None if it does not load."""
    try:
        return manifest.load(directory).name
    except ManifestError:
        return None


async def owned(session: Session, name: str) -> bool:
    """Whether this session added each version `name`'s record holds (none: it is
    gone; unreadable: not, and said)."""
    try:
        held = await session.target.versions(name)
    except AdminError as e:
        print(f"  ! cannot read the versions of {name}: {e}", flush=True)
        return False
    return held <= session.made.get(name, set())


async def release(session: Session, name: str, why: str) -> None:
    """Remove `name` (every version) if this session added each version it holds;
    else keep it serving, and say how to remove it."""
    try:
        held = await session.target.versions(name)
    except AdminError as e:
        print(f"  ! cannot remove {name}: {e}", flush=True)
        return
    if held and not held <= session.made.get(name, set()):
        print(f"  kept      {name:<16} ({why}; it holds versions this dev session did not "
              f"deploy: `edgefn delete {name}` removes it)", flush=True)
        return
    session.made.pop(name, None)
    try:
        await session.target.remove(name)
    except (NotFound, AdminError) as e:
        print(f"  ! cannot remove {name}: {e}", flush=True)
        return
    print(f"  removed   {name:<16} ({why})", flush=True)


async def watch(session: Session, root: Path) -> None:
    """Redeploy a folder when its files change; release the function of a folder
    that has been gone (or held no edgefn.toml) for `GONE_SECONDS`: one moved
    away and back meanwhile keeps its function and history."""
    served = session.served
    seen = {d: snapshot(d) for d in function_dirs(root)}
    gone: dict[Path, float] = {}  # folder -> when it was first seen gone (monotonic)
    while True:
        await asyncio.sleep(POLL_SECONDS)
        dirs = function_dirs(root)
        for d in dirs:
            gone.pop(d, None)
            snap = snapshot(d)
            if seen.get(d) != snap:
                seen[d] = snap
                print(f"change in {d}: redeploying", flush=True)
                await deploy_dir(session, d)
        now = time.monotonic()
        for d in [d for d in served if d not in dirs]:
            if now - gone.setdefault(d, now) < GONE_SECONDS:
                continue
            del gone[d]
            seen.pop(d, None)
            name = served.pop(d)
            await release(session, name, f"{d} is gone")
            for other in dirs:  # a folder refused for declaring that name serves it now
                if other not in served and _name(other) == name:
                    await deploy_dir(session, other)
                    break


async def serve_workers(config: PopConfig, verbosity: int, dev_dir: str | None) -> None:
    """``workers = N``: see `runtime.workers.primary.serve`; with `dev_dir`, deploy
    and watch its functions through the admin API (every worker follows)."""
    from runtime.workers.primary import running_workers
    from runtime.workers.primary import serve as serve_n

    if dev_dir is None:
        await serve_n(config, verbosity)
        return
    async with StopSignals() as stop, running_workers(config, verbosity) as (primary, info):
        print(f"edgefn PoP listening on {info.public} ({primary.count} workers, "
              f"SO_REUSEPORT)", flush=True)
        print(f"  admin API on {info.admin} (token in {config.data_dir / 'admin.token'})",
              flush=True)
        await develop(through_admin(config.data_dir), Path(dev_dir),
                      lambda: AdminClient(config.data_dir).request("GET", "/v1/functions")
                      ["functions"], stop)


async def serve(config: PopConfig, dev_dir: str | None) -> None:
    """Run a PoP until SIGINT/SIGTERM; with `dev_dir`, deploy and watch its functions.
    Raises what `running_pop` raises (`DataDirBusy`, OSError for a taken port),
    `Interrupted` for a signal before it serves."""
    async with StopSignals() as stop, \
            running_pop(config, freeze_heap=True) as (pop, public, admin):
        print_addresses(pop, public.address, admin.address, config.data_dir)
        if dev_dir is None:
            print_functions(pop.registry.listing())
            await stop.wait()
        else:
            await develop(in_process(pop.registry), Path(dev_dir), pop.registry.listing, stop)


async def develop(target: Target, root: Path, listing: Callable[[], list[Any]],
                  stop: StopSignals) -> None:
    """`edgefn dev`: deploy every function folder under `root`, then redeploy one
    when its files change and release the function of one that goes (`release`),
    until SIGINT/SIGTERM. While the first deploys run, a request to a path no
    function serves yet gets 503 ``starting`` (`target.starting`), not a 404 that
    is not true for long."""
    session = Session(target)
    dirs = function_dirs(root)

    def progress(done: int) -> str:
        return f"edgefn dev is deploying the functions under {root} ({done} of {len(dirs)} done)"

    await say_starting(target, progress(0))
    print(f"dev mode: deploying functions under {root}", flush=True)  # every worker says so
    for i, d in enumerate(dirs):
        if i:
            await say_starting(target, progress(i))
        await deploy_dir(session, d)
    await say_starting(target, None)
    watcher = asyncio.create_task(watch(session, root))
    print_functions(await asyncio.to_thread(listing))
    await stop.wait()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


async def say_starting(target: Target, why: str | None) -> None:
    """`target.starting(why)`; where the PoP refuses it, a line says so (the deploys
    go on: the 503 is a courtesy)."""
    try:
        await target.starting(why)
    except (AdminError, Failure) as e:
        print(f"  ! {e}", flush=True)


def print_addresses(pop: PoP, public: tuple[str, int], admin: tuple[str, int],
                    data: Path) -> None:
    host, port = public
    print(f"edgefn PoP listening on http://{host}:{port}", flush=True)
    print(f"  admin API on {admin[0]}:{admin[1]} (token in {data / 'admin.token'})", flush=True)
    if pop.ai is not None:
        print(f"  OpenAI-compatible API on http://{host}:{port}/v1 "
              f"(model worker pid {pop.ai.client.pid or 'external'})", flush=True)


def print_functions(fns: list[Any]) -> None:
    print(f"serving {len(fns)} function(s):", flush=True)
    for f in fns:
        routes = ", ".join((r.get("host") or "") + r["path"] for r in f["routes"])
        print(f"  {f['name']:<16} {f['version']}  {routes}", flush=True)
