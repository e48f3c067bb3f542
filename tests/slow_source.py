"""A source that sleeps on every read, so tests can act while a pass is running.

Lives in its own module so that worker processes can import it.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from quantem_flow.io.memory import ArraySource


class SlowArraySource(ArraySource):
    """An in-memory array whose reads take ``delay_s`` each."""

    format: ClassVar[str] = "memory"

    def __init__(self, array: np.ndarray, *, delay_s: float = 0.2):
        super().__init__(array)
        self.delay_s = delay_s

    def read(
        self, rows: tuple[int, int], cols: tuple[int, int], *, buffer: Any = None
    ) -> np.ndarray:
        time.sleep(self.delay_s)
        return super().read(rows, cols, buffer=buffer)
