"""Draw docs/images/ssb_quality.png: SSB phases on the wave-optics synthetic data, good and bad.

Each panel is a reconstruction of the same specimen with its correlation to the
truth and its double-overlap loss, so docs/ssb-quality.md can show what the
numbers look like.  Run: ``python scripts/ssb_quality_figures.py [OUT.png]``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import quantem_flow as qf
from quantem_flow.synthetic import synthetic_dataset

BASE = {"model": "wave", "scan_shape": (48, 64), "detector_shape": (64, 72), "seed": 0}


def _r(a: np.ndarray, b: np.ndarray) -> float:
    x = np.asarray(a, float) - np.mean(a)
    y = np.asarray(b, float) - np.mean(b)
    return float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))


def main(out: Path) -> None:
    """Reconstruct each case and draw the panels into ``out``."""
    runs = [
        ("5e5 e/frame, right parameters", {"dose_per_frame": 5e5, "dtype": "uint32"}, {}),
        ("5e4 e/frame (the demo), right parameters", {"dose_per_frame": 5e4}, {}),
        ("5e3 e/frame, right parameters", {"dose_per_frame": 5e3}, {}),
        ("5e4 e/frame, defocus off by 50 Å", {"dose_per_frame": 5e4}, {"defocus_A": 50.0}),
        (
            "5e4 e/frame, semiangle 16 mrad (20 true)",
            {"dose_per_frame": 5e4},
            {"semiangle_mrad": 16.0},
        ),
        ("5e4 e/frame, defocus off by 150 Å", {"dose_per_frame": 5e4}, {"defocus_A": 150.0}),
    ]
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.6), layout="constrained")
    flat = list(axes.ravel())
    truth_ax, spare = flat[0], flat[4]
    panels = [a for i, a in enumerate(flat) if i not in (0, 4)]
    truth = None
    for ax, (title, data_kw, ssb_kw) in zip(panels, runs, strict=True):
        data, truth = synthetic_dataset(**BASE, **data_kw)
        ds = qf.open(data, calibration=truth.calibration())
        options = {"voltage_kV": 300, "semiangle_mrad": 20, "allow_implausible": True, **ssb_kw}
        (obj,) = qf.compute(qf.ssb(ds, **options), client="synchronous")
        quality = obj.provenance.parameters["quality"]
        row, col = obj.axes  # scan steps differ: draw in Å, not in pixels
        extent = (0, col.size * col.sampling, row.size * row.sampling, 0)
        ax.imshow(obj.phase, cmap="gray", interpolation="nearest", extent=extent)
        ax.set_title(
            f"{title}\nr = {_r(obj.phase, truth.phase):.2f} with the truth; loss "
            f"{quality['double_overlap_loss']:.2f} ({quality['verdict']})",
            fontsize=9,
        )
        ax.set_axis_off()
        print(title, round(_r(obj.phase, truth.phase), 3), round(quality["double_overlap_loss"], 3))
    assert truth is not None
    truth_ax.imshow(truth.phase, cmap="gray", interpolation="nearest", extent=extent)
    truth_ax.set_title(
        "truth: the phase band-limited to the SSB band\n(0.25 rad peaks)", fontsize=9
    )
    truth_ax.set_axis_off()
    spare.set_axis_off()
    spare.text(
        0.0,
        0.5,
        "SSB on the wave-optics synthetic specimen\n(300 kV, 20 mrad, 48 x 64 scan).\n\n"
        "r: Pearson correlation of the SSB phase\nwith the truth.\n"
        "loss: the double-overlap loss in the\nprovenance (quality.double_overlap_loss).",
        fontsize=9,
        va="center",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/images/ssb_quality.png"))
