"""Reader conformance cases of pnCCD FRMS6 acquisitions (:mod:`tests.io.writers_frms6`).

The detector of the suite (6 x 9) is the unfolded frame: read out as 3 rows
of 18 columns.  The signal frames span several ``.frms6`` files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from .test_reader_conformance import DETECTOR, SCAN, Case, _random
from .writers_frms6 import write_frms6


def _frms6(stem: bool, count_in_header: bool) -> Callable[[Path, np.random.Generator], Case]:
    def make(tmp: Path, rng: np.random.Generator) -> Case:
        expected = _random(rng, (*SCAN, *DETECTOR), "uint16")
        darks = _random(rng, (4, *DETECTOR), "uint16")
        hdr = write_frms6(
            tmp,
            expected.reshape(-1, *DETECTOR),
            darks,
            stem_image_size=SCAN if stem else None,
            per_file=12,
            count_in_header=count_in_header,
        )
        return Case(hdr, {} if stem else {"scan_shape": SCAN}, expected, "frms6")

    return make


CASES: dict[str, Callable[[Path, np.random.Generator], Case]] = {
    "frms6-hdr-scan": _frms6(True, True),
    "frms6-scan-given-old-headers": _frms6(False, False),
}
