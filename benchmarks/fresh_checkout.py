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

import subprocess
import sys
from pathlib import Path

__all__ = ["compile_bytecode"]


def compile_bytecode(code: Path) -> None:
    """Write ``code/quantem_flow``'s bytecode (``compileall``, quiet; errors raise)."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(code) / "quantem_flow")],
        check=True,
    )
