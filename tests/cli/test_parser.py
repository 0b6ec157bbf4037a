"""The parser, in process: every option shows its default, every command an
example, kv/vectors/lora list their operations, handlers resolve, --version."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from importlib import metadata

import pytest

import runtime
from runtime.cli import commands, parser
from runtime.cli.main import handler

Parsers = Iterator[tuple[str, argparse.ArgumentParser]]


def walk(p: argparse.ArgumentParser | None = None) -> Parsers:
    """The top parser and every command and operation parser, with their prog."""
    p = p or parser.build()
    yield p.prog, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from walk(sub)


def test_every_option_shows_its_default() -> None:
    missing = [f"{prog} {a.option_strings[0]}" for prog, p in walk() for a in p._actions
               if a.option_strings and a.nargs != 0 and not a.required
               and "default" not in parser.option_help(a)]
    assert missing == []


def test_a_positional_with_a_default_shows_it() -> None:
    dev = dict(walk())["edgefn dev"]
    assert "(default: functions)" in dev.format_help()


def test_every_command_and_operation_has_an_example() -> None:
    progs = [prog for prog, p in walk() if "example:\n  edgefn " not in p.format_help()]
    assert progs == []


@pytest.mark.parametrize(("command", "ops"), [
    ("kv", ["get", "put", "delete", "increment", "list"]),
    ("vectors", ["create", "upsert", "query", "import", "stats"]),
    ("lora", ["add", "ls", "rm"]),
])
def test_commands_with_operations_list_them_in_their_help(command: str, ops: list[str]) -> None:
    text = dict(walk())[f"edgefn {command}"].format_help()
    listed = [line.split()[0] for line in text.split("operations:")[1].splitlines()[2:]
              if line.startswith("    ") and line.split()]
    assert listed[:len(ops)] == ops


def test_every_handler_names_a_function() -> None:
    specs = {p.get_default("handler") for _, p in walk()} - {None}
    assert len(specs) >= 12
    for spec in specs:
        assert callable(handler(spec)), spec


def test_version_comes_from_the_package_metadata_else_the_checkout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "version", lambda name: "9.9.9")
    assert parser.version() == "9.9.9"

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert parser.version() == runtime.__version__


def test_json_arguments_are_parsed_and_checked() -> None:
    args = parser.build().parse_args(["vectors", "query", "i", "--vector", "[1, 2.5]",
                                      "--filter", '{"lang": "en"}'])
    assert (args.vector, args.filter) == ([1, 2.5], {"lang": "en"})
    for argv in (["vectors", "query", "i", "--vector", "[true]"],
                 ["vectors", "query", "i", "--vector", "[1]", "--filter", "[1]"]):
        with pytest.raises(parser.UsageError, match="expected a JSON"):
            parser.build().parse_args(argv)


def test_options_may_come_after_the_operation() -> None:
    args = parser.build().parse_args(["kv", "get", "ns", "k", "--data", "d", "--json"])
    assert (args.data, args.json, args.handler) == ("d", True, "runtime.cli.store:kv_command")
    args = parser.build().parse_args(["ls", "-vv"])
    assert args.verbose == 2


KNOWN = ["3f2a000000000001", "3f2b000000000002", "9c00000000000003"]


@pytest.mark.parametrize(("prefix", "version"), [
    ("9", "9c00000000000003"), ("3f2a", "3f2a000000000001"),
    ("3f2b000000000002", "3f2b000000000002"),
    ("3F2A", "3f2a000000000001"), ("9C00000000000003", "9c00000000000003"),  # "no version"
])
def test_a_unique_version_prefix_resolves(prefix: str, version: str) -> None:
    assert commands.resolve_version("hello", prefix, KNOWN) == version


def test_an_ambiguous_version_prefix_lists_the_candidates() -> None:
    with pytest.raises(commands.Failure, match="3f2a000000000001, 3f2b000000000002") as e:
        commands.resolve_version("hello", "3f", KNOWN)
    assert e.value.code == "ambiguous_version"


@pytest.mark.parametrize("prefix", ["77", "", "3f2a0000000000019"])
def test_an_unknown_version_prefix_says_so(prefix: str) -> None:
    with pytest.raises(commands.NotFound, match=f"has no version {prefix!r}"):
        commands.resolve_version("hello", prefix, KNOWN)


@pytest.mark.parametrize("scale", ["nan", "0", "-1", "inf", "x"])
def test_a_lora_scale_that_is_no_positive_number_is_refused_by_the_cli(
        scale: str) -> None:
    """`--scale nan` went out as JSON no parser reads ("JSON is malformed")."""
    with pytest.raises(parser.UsageError, match="argument --scale: expected a number"):
        parser.build().parse_args(["lora", "add", "x", "a.gguf", "--scale", scale])
    assert parser.build().parse_args(["lora", "add", "x", "a.gguf", "--scale", "0.5"]).scale \
        == 0.5



@pytest.mark.parametrize(("argv", "words"), [
    (["events", "--status", "abc"], "argument --status: expected a status (404) or a class"),
    (["tail", "--status", "6xx"], "argument --status: expected a status"),
    (["events", "--limit", "0"], "argument --limit: must be 1 or more, got 0"),
    (["kv", "list", "ns", "--limit", "0"], "argument --limit: must be 1 or more"),
    (["kv", "list", "ns", "--limit", "1001"], "argument --limit: must be at most 1000"),
    (["topology", "load", "--geo", "eu-west", "-n", "0"], "argument -n: must be 1 or more, got 0"),
    (["topology", "load", "--geo", "eu-west", "-n", "-3"], "argument -n: must be 1 or more"),
])
def test_bad_filter_values_are_refused_as_flags(argv: list[str], words: str) -> None:
    """They reached the PoP and came back as `query: field status` (exit status 1,
    where every other bad flag value is 2, named)."""
    with pytest.raises(parser.UsageError, match=re.escape(words)):
        parser.build().parse_args(argv)
    assert parser.build().parse_args(["events", "--status", "5xx", "--limit", "3"]).status \
        == "5xx"
