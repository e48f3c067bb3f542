"""Single-sideband (SSB) ptychography as one package.

- :mod:`.operator`: the :class:`SSB` operator and :func:`ssb` (where the
  parameters are declared, :class:`SSBParams`), the plan and the
  reconstruction;
- :mod:`.parameters`: checking and parsing them;
- :mod:`.geometry`: scan step, detector sampling, centre and bright field
  (:class:`SSBGeometry`);
- :mod:`.fit`: the double-overlap loss, its reading and the aberration fit;
- :mod:`.stages`: the physics of the FFT and accumulation stage (the
  aberration phase :func:`~.stages.chi`, the frequency grid, spectra,
  trotter sums, assembly), written once against the runtimes' array
  adapters (:mod:`quantem_flow.runtimes.array_ops`).
"""

from __future__ import annotations

from .fit import LOSS_BANDS, loss_reading
from .geometry import SSBGeometry
from .operator import SSB, SSBParams, ssb
from .parameters import FIT_NAMES, SEMIANGLE_RTOL

__all__ = [
    "FIT_NAMES",
    "LOSS_BANDS",
    "SEMIANGLE_RTOL",
    "SSB",
    "SSBGeometry",
    "SSBParams",
    "loss_reading",
    "ssb",
]
