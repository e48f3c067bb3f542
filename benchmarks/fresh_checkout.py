"""Make a checkout's Python bytecode as an installed copy has it, before fresh-interpreter timings.

``pip install`` compiles a wheel's modules to bytecode; an editable install
or a ``git archive`` copy writes it on first import, unless
``PYTHONDONTWRITEBYTECODE`` is set (this project's shells set it), in which
case every fresh interpreter compiles every ``quantem_flow`` module from
source again (0.1-0.2 s of a first compute here).  The benchmarks that time
fresh interpreters call :func:`compile_bytecode` for every checkout first (not
timed), so each checkout is timed as a user's install runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["compile_bytecode", "run_in_tree"]


def compile_bytecode(code: Path) -> None:
    """Write ``code/quantem_flow``'s bytecode (``compileall``, quiet; errors raise)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(code) / "quantem_flow")],
        check=True,
    )


def run_in_tree(
    tree: str, code: str, args: Sequence[str], *, label: str, timeout_s: float = 900
) -> dict[str, Any]:
    """Run ``python -c code *args`` on ``tree``'s ``quantem_flow``; its ``RESULT`` line's JSON.

    The child prints ``FROM <quantem_flow.__file__>`` first (checked to be under
    ``tree``) and ``RESULT <json>`` last; ``label`` names the run in errors.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(tree).resolve())
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=env["PYTHONPATH"],  # "-c" puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
        if line.startswith("FROM ") and not line[5:].startswith(env["PYTHONPATH"]):
            raise RuntimeError(f"{label} imported quantem_flow from {line[5:]}")
    raise RuntimeError(f"{label} gave no result:\n{out.stdout}\n{out.stderr[-3000:]}")
