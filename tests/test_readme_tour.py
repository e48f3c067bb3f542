"""The README's "A short tour" runs as written (issue 12).

The tour opens ``scan_master.h5``, a Dectris master file with a 256 x 256
scan.  The test writes exactly that (a synthetic specimen, 64 x 64 detector,
bitshuffle + LZ4 data files as the detector writes them) into a fresh
folder, then runs the README block unchanged in a plain interpreter (no
``__main__`` guard, the embedded default cluster) and checks what it
printed and saved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf

from .io.writers import write_dectris

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def _tour() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## A short tour")
    a = text.index("```python\n", start) + len("```python\n")
    return text[a : text.index("```", a)]


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    code = _tour()
    assert '"scan_master.h5"' in code and "scan_shape=(256, 256)" in code, code
    data, _ = qf.synthetic_dataset(scan_shape=(256, 256), detector_shape=(64, 64))
    write_dectris(tmp_path, "scan", data.reshape(-1, 64, 64), frames_per_file=10000)
    env = dict(os.environ, QUANTEM_FLOW_PROGRESS="0", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    units, angle = proc.stdout.split()[-2:]
    assert units == "rad"  # calibrated in the tour: iDPC phase in radians
    assert np.isfinite(float(angle))
    saved = qf.load_results(tmp_path / "results.h5")
    assert sorted(saved) == ["adf", "bf", "com", "idpc"]
    assert saved["bf"].shape == (256, 256)
    assert saved["adf"].provenance.parameters["inner"] == 30
    for name in ("bf", "adf"):
        image = np.asarray(saved[name])
        assert np.isfinite(image).all() and image.std() > 0, name
