"""What a Python function's pool and its isolate-host processes are configured with.

`HostConfig` is also the host process's command line (as JSON), so it holds
plain values only.
"""

from __future__ import annotations

from dataclasses import dataclass

PIPELINE_AUTO = -1  # `pool.pipeline = "auto"` (`runtime.executors.python.scheduler`)


@dataclass(frozen=True)
class HostConfig:
    name: str
    version: str
    function_dir: str
    module: str
    handler: str
    cpu_ms: int
    wall_ms: int
    memory_mb: int
    recycle_after: int
    min_isolates: int
    max_isolates: int
    max_response_mb: int = 16
    pipeline: int = 0  # jobs sent ahead to a busy isolate, at most (`pool.pipeline`), or AUTO
    env: tuple[tuple[str, str], ...] = ()  # the manifest's `env`, also set in the host's environ
    insecure: bool = False  # run even where a sandbox layer is missing (--insecure-python)
    owner: str = ""  # `Manifest.tenant`: whose its large frames are (`frame_budget`)
    # KV reads in the host (`local_kv_env.plan`): the store's folder ("": off), its map
    # size, the declared namespaces, the owners' generation (a descriptor passed down)
    kv_dir: str = ""
    kv_map_size: int = 0
    kv_namespaces: tuple[str, ...] = ()
    kv_generation_fd: int = -1

    @property
    def label(self) -> str:
        """``name@version``: how the function's log lines and errors are tagged."""
        return f"{self.name}@{self.version}"

    @property
    def max_response(self) -> int:
        """The largest response body, in bytes (plain or streamed)."""
        return self.max_response_mb << 20
