"""Every option an error message or hint names exists on the command it names."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import quantem_flow
import quantem_flow.cli as cli

PACKAGE = Path(quantem_flow.__file__).parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
NAMED = re.compile(r"quantem-flow ([a-z]+)\b[^.;]*$")
#: Calls whose string arguments a user reads: errors, warnings, printed lines.
MESSAGE_CALL = re.compile(r"(Error|Warning)$|^_say$|^print$|^warn$")


def _options() -> dict[str, set[str]]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()
    }


def _handlers() -> dict[str, str]:
    parser = cli._parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: p._defaults["func"].__name__ for name, p in sub.choices.items()}


def _strings(node: ast.AST) -> str:
    return " ".join(
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def _messages(func: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(func):
        if isinstance(n, ast.Raise) and n.exc is not None:
            out.append(_strings(n.exc))
        elif isinstance(n, ast.Call):
            name = getattr(n.func, "id", None) or getattr(n.func, "attr", "")
            if name and MESSAGE_CALL.search(name):
                out.append(_strings(n))
    return out


def _problems(message: str, commands: set[str], options: dict[str, set[str]]) -> list[str]:
    """Flags in ``message`` missing from the command it names, else from ``commands``."""
    bad = []
    for m in FLAG.finditer(message):
        before = message[: m.start()]
        if re.search(r"\bdask worker\b[^.;]*$", before):
            continue  # an option of Dask's own command
        named = NAMED.search(before)
        targets = {named.group(1)} if named and named.group(1) in options else commands
        bad += [f"{c}: {m.group(0)}" for c in sorted(targets) if m.group(0) not in options[c]]
    return bad


def test_cli_messages_name_only_options_of_their_commands() -> None:
    options = _options()
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    calls = {
        name: {
            c.func.id
            for c in ast.walk(f)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in funcs
        }
        for name, f in funcs.items()
    }
    reached_by: dict[str, set[str]] = {}
    for command, handler in _handlers().items():
        seen: set[str] = set()
        todo = [handler]
        while todo:
            f = todo.pop()
            if f not in seen:
                seen.add(f)
                todo += calls.get(f, ())
        for f in seen:
            reached_by.setdefault(f, set()).add(command)
    assert reached_by["_check_figures"] == {"run", "demo"}  # the analysis sees the call graph
    bad = []
    checked = 0
    for name, func in funcs.items():
        for message in _messages(func):
            checked += len(FLAG.findall(message))
            bad += [
                f"{name}: {p}" for p in _problems(message, reached_by.get(name, set()), options)
            ]
    assert checked > 20
    assert not bad, bad


def test_messages_elsewhere_name_real_options_of_the_command_they_name() -> None:
    options = _options()
    bad = []
    found = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = _strings(node)
            else:
                continue
            found += sum(
                1
                for m in FLAG.finditer(text)
                if (named := NAMED.search(text[: m.start()])) and named.group(1) in options
            )
            bad += [f"{path.relative_to(PACKAGE)}: {p}" for p in _problems(text, set(), options)]
    assert found > 5
    assert not bad, bad


def test_the_analysis_catches_a_missing_option() -> None:
    options = _options()
    assert _problems("pass --overwrite, --figures DIR", {"demo"}, options) == ["demo: --figures"]
    assert _problems("rerun: quantem-flow run x.yaml --overwrite", {"demo"}, options) == []
    assert _problems("see quantem-flow demo --nope", set(), options) == ["demo: --nope"]


@pytest.mark.parametrize("command", ["demo"])
def test_a_second_demo_suggests_only_its_own_options(tmp_path: Path, command: str) -> None:
    run = [sys.executable, "-m", "quantem_flow", command, "--synchronous"]
    first = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    second = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert second.returncode != 0
    flags = set(FLAG.findall(second.stderr))
    assert flags and flags <= _options()[command], second.stderr
    # the figures alone left behind: the figures' own message
    for f in (tmp_path / "quantem-flow-demo").iterdir():
        if f.is_file():
            f.unlink()
    for d in ("images",):
        for f in (tmp_path / "quantem-flow-demo" / d).glob("*"):
            f.unlink()
    third = subprocess.run(run, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert third.returncode != 0 and "figure file(s) already exist" in third.stderr
    assert set(FLAG.findall(third.stderr)) <= _options()[command], third.stderr
