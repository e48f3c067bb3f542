"""The README's "Figures, arrays, xarray, Dask" and "Where it computes" code runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def _block(text: str, heading: str) -> str:
    start = text.index(heading)
    a = text.index("```python\n", start) + len("```python\n")
    return text[a : text.index("```", a)]


def test_readme_figures_interop_and_cluster_blocks(tmp_path: Path) -> None:
    pytest.importorskip("xarray")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = _block(readme, "## Figures, arrays, xarray, Dask") + _block(
        readme, "## Where it computes"
    )
    env = dict(os.environ, QUANTEM_FLOW_PROGRESS="0", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split() == ["px", "px"]  # uncalibrated synthetic data: never mrad
    assert (tmp_path / "overview.png").stat().st_size > 10_000
