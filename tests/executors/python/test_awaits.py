"""Which modules make their event loop before READY (`guest.awaits`): the async code a
module holds, however it is wrapped; what it reaches only through another module is
the documented exception (its first await makes the loop)."""

from __future__ import annotations

import sys
import types
import uuid

import pytest

from runtime.executors.python.guest import holds_async

CASES = {
    "plain": ("def handle(request, env):\n    return 'hi'\n", False),
    "async def": ("async def handle(request, env):\n    return 'hi'\n", True),
    "async generator": ("async def chunks():\n    yield b'x'\n\n"
                        "def handle(request, env):\n    return chunks()\n", True),
    "nested": ("def handle(request, env):\n    async def inner():\n        return 1\n"
               "    return inner()\n", True),
    "decorated, no wraps": ("def logged(f):\n    def w(*a):\n        return f(*a)\n"
                            "    return w\n\n@logged\nasync def handle(request, env):\n"
                            "    return 'hi'\n", True),
    "decorated, wraps": ("import functools\n\ndef logged(f):\n    @functools.wraps(f)\n"
                         "    def w(*a):\n        return f(*a)\n    return w\n\n"
                         "@logged\nasync def handle(request, env):\n    return 'hi'\n", True),
    "staticmethod": ("class Api:\n    @staticmethod\n    async def get():\n        return 1\n\n"
                     "def handle(request, env):\n    return Api.get()\n", True),
    "classmethod": ("class Api:\n    @classmethod\n    async def get(cls):\n        return 1\n\n"
                    "def handle(request, env):\n    return Api.get()\n", True),
    "__await__": ("class Later:\n    def __await__(self):\n        yield from ()\n"
                  "        return 'hi'\n\ndef handle(request, env):\n    return Later()\n", True),
    "inherited __await__": ("class Base:\n    def __await__(self):\n        yield from ()\n"
                            "\nclass Later(Base):\n    pass\n\n"
                            "def handle(request, env):\n    return Later()\n", True),
    "partial": ("import functools\n\nasync def get(n):\n    return n\n\n"
                "handle = functools.partial(get, 1)\n", True),
    # the documented limit: what is reached only through another module
    "through a module": ("import types\n\ndef handle(request, env):\n"
                         "    return types.coroutine\n", False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_module_holds_async_code_however_it_is_wrapped(name: str) -> None:
    source, want = CASES[name]
    module = types.ModuleType(f"_awaits_{uuid.uuid4().hex}")
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, f"<{name}>", "exec"), vars(module))
        assert holds_async(module.handle) is want
    finally:
        del sys.modules[module.__name__]
