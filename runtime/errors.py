"""The runtime's exception tree.

Messages point at the data: a manifest error names the file and the field, a
function error names the function, its version and the limit it hit.
"""

from __future__ import annotations


class EdgefnError(Exception):
    """Base of every error the runtime raises on purpose."""


class ManifestError(EdgefnError):
    """An `edgefn.toml` is missing, unparsable or invalid.

    `str(err)` reads ``<file>: field `<field>`: <what was expected>``.
    """

    def __init__(self, file: str, message: str, field: str | None = None) -> None:
        self.file = file
        self.field = field
        self.reason = message
        where = f"{file}: field `{field}`" if field else file
        super().__init__(f"{where}: {message}")


class DeployError(EdgefnError):
    """A deploy was rejected (bad package, module, route conflict); nothing changed."""


class NotFound(EdgefnError):
    """A function or version that does not exist was named."""


class FunctionError(EdgefnError):
    """A user function failed: a trap, an exceeded limit or an invalid response.

    `kind` is a stable machine-readable tag (``trap``, ``cpu_limit``,
    ``memory_limit``, ``wall_limit``, ``bad_response``, ``crash``) and `status`
    the HTTP status the client receives.
    """

    def __init__(self, kind: str, status: int, message: str) -> None:
        self.kind = kind
        self.status = status
        super().__init__(message)
