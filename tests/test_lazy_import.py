"""``import quantem_flow`` loads no Dask, distributed or matplotlib (issue 24, item 7).

The graph layer is imported on first use (``qf.compute``, ``Dataset4D.persist``), so opening
files, building pipelines and reading results start fast; the time itself is measured in
benchmarks (RESULTS.md), this checks what is imported and that the lazy names work.
"""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
import numpy as np
import quantem_flow as qf
names = ("dask", "distributed", "matplotlib", "numba", "h5py", "zarr")
heavy = [m for m in names if m in sys.modules]
print("heavy:", ",".join(heavy) or "-")
ds = qf.open(np.ones((4, 4, 8, 8), dtype=np.uint16))
p = ds.persist(client="synchronous")   # the lazy persist hook loads the graph layer
(bf,) = qf.compute(qf.virtual_bf(p, radius=2.0, center=(4.0, 4.0)), client="synchronous")
print("bf:", float(bf.data.sum()))
print("loaded:", "quantem_flow.graphs" in sys.modules)
print("distributed:", "distributed" in sys.modules)
"""


def _printed(script: str) -> dict[str, str]:
    """Run ``script`` in a fresh interpreter; its ``name: value`` lines."""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(line.split(": ", 1) for line in run.stdout.strip().splitlines())


def test_import_is_light_and_the_lazy_names_work() -> None:
    lines = _printed(SCRIPT)
    assert lines["heavy"] == "-", lines
    assert float(lines["bf"]) > 0
    assert lines["loaded"] == "True"  # loaded once used
    # a synchronous compute needs no cluster: distributed stays unloaded (0.15-0.3 s)
    assert lines["distributed"] == "False"


def test_the_worker_programs_modules_leave_numba_to_the_first_kernel() -> None:
    """A worker program starts without Numba (0.15 s): the CPU runtime loads it on first use."""
    script = (
        "import sys\n"
        "import quantem_flow.graphs.local_worker, quantem_flow.graphs.worker\n"
        "import quantem_flow.graphs.tasks, quantem_flow.graphs.streamed\n"
        "print('numba:', 'numba' in sys.modules)\n"
    )
    assert _printed(script) == {"numba": "False"}


def test_opening_a_file_and_ssb_on_threads_never_load_numba(tmp_path: object) -> None:
    """Detection sniffs every reader without importing Numba; SSB compiles its loop as IR."""
    script = (
        "import sys, numpy as np\n"
        "import quantem_flow as qf\n"
        "from quantem_flow.synthetic import synthetic_dataset\n"
        "data, _ = synthetic_dataset(scan_shape=(16, 16), detector_shape=(32, 32),\n"
        "                            probe_radius_px=6.0)\n"
        f"np.save({str(tmp_path)!r} + '/d.npy', data.astype(np.uint16))\n"
        "cal = qf.Calibration(scan_sampling=0.5, scan_units='Å', detector_sampling=3.0,\n"
        "                     detector_units='mrad', accelerating_voltage_kV=300.0)\n"
        f"ds = qf.open({str(tmp_path)!r} + '/d.npy', calibration=cal)\n"
        "print('after open:', 'numba' in sys.modules, 'h5py' in sys.modules)\n"
        "lazy = qf.ssb(ds, voltage_kV=300.0, semiangle_mrad=18.0)\n"
        "(obj,) = qf.compute(lazy, client='threads', progress=False)\n"
        "print('after ssb:', 'numba' in sys.modules, bool(np.isfinite(obj.phase).all()))\n"
    )
    lines = _printed(script)
    assert lines["after open"] == "False False"
    assert lines["after ssb"] == "False True"
