"""The double-overlap loss, what it means, and fitting the aberrations by minimising it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...runtimes.array_ops import Aberrations, ArrayOps
from .geometry import SSBGeometry
from .stages import QGrid, accumulate, assemble, spectra

__all__ = ["LOSS_BANDS", "AberrationFit", "loss_reading"]


#: Double-overlap loss bands and what they mean, measured on the wave-optics
#: synthetic data (docs/ssb-quality.md): noise-free and right parameters < 0.01;
#: 5e5 e/frame 0.07; 5e4 e/frame 0.41 (phase r = 0.98); 5e3 e/frame 0.87 (r = 0.83);
#: defocus 50 Å wrong 0.73 (r = 0.89); 150 Å wrong 0.98 (r = -0.07).
LOSS_BANDS = (
    (
        0.15,
        "low",
        "the weak-phase model with these parameters explains the double-overlap "
        "signal; what is left is mostly shot noise",
    ),
    (
        0.6,
        "moderate",
        "a good part of the signal is explained; the rest is noise or a small "
        "parameter error. Compare runs on the same data: the lower loss has the better "
        "parameters (defocus, semiangle, rotation)",
    ),
    (
        1.01,
        "high",
        "most of the double-overlap signal is not explained: check defocus_A, "
        "semiangle_mrad, rotation_deg/transpose, the voltage and the detector calibration (or "
        "the dose is very low); fit_aberrations=True can find defocus and astigmatism",
    ),
)


def loss_reading(loss: float) -> dict[str, Any]:
    """What a double-overlap loss says about a reconstruction, in words.

    Parameters
    ----------
    loss
        ``sum |F - model|^2 / sum |F|^2`` over the trotters (0: all explained).

    Returns
    -------
    dict
        ``double_overlap_loss``, ``verdict`` (``"low"``, ``"moderate"`` or
        ``"high"`` loss) and ``reading``; docs/ssb-quality.md shows the figures.
    """
    for upper, verdict, text in LOSS_BANDS:
        if loss < upper:
            return {
                "double_overlap_loss": loss,
                "verdict": verdict,
                "reading": f"double-overlap loss {loss:.2f} ({verdict}; it grows as the "
                f"dose falls): {text}",
            }
    return {
        "double_overlap_loss": loss,
        "verdict": "high",
        "reading": f"double-overlap loss {loss:.2f} (high): {LOSS_BANDS[-1][2]}",
    }


class AberrationFit:
    """The aberration fit of the SSB operator (a mixin; the attributes are the operator's)."""

    defocus_A: float
    astigmatism_A: float
    astigmatism_angle_deg: float
    fit_names: tuple[str, ...]
    fit_max_pixels: int
    fit_max_evaluations: int

    def aberrations(self, c10: float, c12: float, phi12_deg: float) -> Aberrations:
        """The axial aberrations with these first-order terms (the operator's)."""
        raise NotImplementedError  # pragma: no cover - SSB defines it

    # -- aberration fit ------------------------------------------------------------------
    def _fit(
        self,
        ops: ArrayOps,
        grid: QGrid,
        geo: SSBGeometry,
        rows: np.ndarray,
        load: Any,
    ) -> tuple[float, float, float, dict[str, Any]]:
        from scipy.optimize import minimize

        n = rows.size
        take = np.unique(np.linspace(0, n - 1, num=min(self.fit_max_pixels, n)).round()).astype(
            np.int64
        )
        block, means, good = load(rows[take])
        take = take[good]
        block, means = block[good], means[good]
        v_r, v_c = geo.v_r[take], geo.v_c[take]
        with ops.lock():
            spec = spectra(ops, block, 1.0 / means, grid)
        del block
        lam, alpha = geo.wavelength_A, geo.alpha_rad
        dof = lam / alpha**2  # depth of field scale (Å)
        names = self.fit_names
        both_astig = "C12" in names and "phi12" in names
        x0: list[float] = []
        steps: list[float] = []
        labels: list[str] = []
        if "C10" in names:
            x0.append(self.defocus_A)
            steps.append(dof)
            labels.append("C10_A")
        if both_astig:
            phi = math.radians(2 * self.astigmatism_angle_deg)
            x0 += [self.astigmatism_A * math.cos(phi), self.astigmatism_A * math.sin(phi)]
            steps += [dof / 2, dof / 2]
            labels += ["C12a_A (C12 cos 2 phi12)", "C12b_A (C12 sin 2 phi12)"]
        elif "C12" in names:
            x0.append(self.astigmatism_A)
            steps.append(dof / 2)
            labels.append("C12_A")
        elif "phi12" in names:
            x0.append(self.astigmatism_angle_deg)
            steps.append(30.0)
            labels.append("phi12_deg")

        def unpack(x: np.ndarray) -> tuple[float, float, float]:
            i = 0
            c10, c12, phi12 = self.defocus_A, self.astigmatism_A, self.astigmatism_angle_deg
            if "C10" in names:
                c10 = float(x[i])
                i += 1
            if both_astig:
                a, b = float(x[i]), float(x[i + 1])
                c12 = math.hypot(a, b)
                phi12 = (math.degrees(math.atan2(b, a)) / 2) % 180.0
            elif "C12" in names:
                c12 = float(x[i])
                if c12 < 0:
                    c12, phi12 = -c12, (phi12 + 90.0) % 180.0
            elif "phi12" in names:
                phi12 = float(x[i]) % 180.0
            return c10, c12, phi12

        evaluations: list[float] = []

        def loss(x: np.ndarray) -> float:
            ab = self.aberrations(*unpack(x))
            with ops.lock():
                sums = accumulate(ops, spec, v_r, v_c, grid, ab, lam)
            value = float(assemble(sums, grid)[1]["loss"])
            evaluations.append(value)
            return value

        start = np.asarray(x0, dtype=np.float64)
        simplex = np.vstack([start] + [start + s * np.eye(len(x0))[i] for i, s in enumerate(steps)])
        loss_start = loss(start)
        res = minimize(
            loss,
            start,
            method="Nelder-Mead",
            options={
                "initial_simplex": simplex,
                "maxfev": self.fit_max_evaluations,
                "xatol": 1e-3 * dof,
                "fatol": 1e-12,
            },
        )
        c10, c12, phi12 = unpack(np.asarray(res.x))
        record = {
            "fitted": list(names),
            "method": "scipy.optimize.minimize(method='Nelder-Mead') with a fixed initial "
            "simplex (deterministic), minimising the double-overlap loss",
            "parameters": labels,
            "start": [float(v) for v in start],
            "initial_simplex": simplex.tolist(),
            "simplex_steps": steps,
            "depth_of_field_A": dof,
            "options": {"maxfev": self.fit_max_evaluations, "xatol": 1e-3 * dof, "fatol": 1e-12},
            "loss_start": loss_start,
            "loss_end": float(res.fun),
            "x": [float(v) for v in np.atleast_1d(res.x)],
            "success": bool(res.success),
            "message": str(res.message),
            "nit": int(res.nit),
            "nfev": int(res.nfev),
            "result": {"C10_A": c10, "C12_A": c12, "phi12_deg": phi12},
            "subset": {
                "n_pixels": int(take.size),
                "of_pixels": int(n),
                "rule": "pixels evenly spaced (by flat index) over the bright-field pixels used",
                "frequencies": "all frequencies of the band",
            },
        }
        if not res.success:
            record["warning"] = "the optimiser stopped before converging; see message"
        return c10, c12, phi12, record
