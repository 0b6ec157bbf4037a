"""A small adapter over subinterpreters: 3.13's private `_interpreters`, or 3.14's
public `concurrent.interpreters` where it exists."""

from __future__ import annotations

from typing import Any

try:  # Python 3.14+
    from concurrent import interpreters as _public  # type: ignore[attr-defined]
except ImportError:
    _public = None
import _interpreters


def create() -> Any:
    """A new isolated interpreter (own GIL, single-phase-init extensions refused)."""
    if _public is not None:
        return _public.create()
    return _interpreters.create(_interpreters.new_config("isolated"))


def share(interp: Any, name: str, value: Any) -> None:
    """Bind `name` in `interp`'s __main__ to a copy of `value` (bytes, str, int,
    None, or tuples of them). Raises NotShareableError (a ValueError) for others."""
    if _public is not None:
        interp.prepare_main({name: value})
    else:
        _interpreters.set___main___attrs(interp, {name: value})


def run(interp: Any, code: str) -> str | None:
    """Run `code` in `interp` on this thread until it returns; the name of the
    exception type it raised, or None."""
    err = run_error(interp, code)
    return None if err is None else err[0]


def run_error(interp: Any, code: str) -> tuple[str, str] | None:
    """Like `run`, but the exception's type name and message, or None."""
    if _public is not None:
        try:
            interp.exec(code)
        except _public.ExecutionFailed as e:
            return str(e.excinfo.type.__name__), str(e.excinfo.msg)
        return None
    # 3.13's run_string returns an exception snapshot or None (typeshed says None).
    err: Any = _interpreters.run_string(interp, code)  # type: ignore[func-returns-value]
    if err is None:
        return None
    # out of memory, the snapshot may come back without the exception's type
    return str(getattr(err.type, "__name__", None) or "InterpreterError"), str(err.msg)


def destroy(interp: Any) -> None:
    if _public is not None:
        interp.close()
    else:
        _interpreters.destroy(interp)
