"""Single-sideband (SSB) ptychography as one package.

- :mod:`.operator`: the :class:`SSB` operator and :func:`ssb` (parameters,
  calibration checks, geometry, the plan, the reconstruction and the
  aberration fit);
- :mod:`.stages`: the physics of the FFT and accumulation stage (the
  aberration phase :func:`~.stages.chi`, the frequency grid, spectra,
  trotter sums, assembly), written once against the runtimes' array
  adapters (:mod:`quantem_flow.runtimes.array_ops`).
"""

from __future__ import annotations

from .operator import LOSS_BANDS, SSB, SSBGeometry, SSBParams, loss_reading, ssb

__all__ = ["LOSS_BANDS", "SSB", "SSBGeometry", "SSBParams", "loss_reading", "ssb"]
