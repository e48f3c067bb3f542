"""Scratch memory the CPU runtime's passes take beyond their outputs, for the memory need.

Kept apart from the kernels (no Numba import) so the client can count it
when it lowers a pass (:func:`~quantem_flow.graphs.lowering.task_memory_need`).
"""

from __future__ import annotations

__all__ = ["EXACT_BLOCK_BYTES", "exact_scratch_bytes"]

#: Bytes of one float64 block of frames the exact NumPy pass converts at a time
#: (:mod:`~quantem_flow.runtimes.cpu.exact_numpy`, the first pass while a kernel compiles).
EXACT_BLOCK_BYTES = 2 * 2**20


def exact_scratch_bytes() -> int:
    """Peak scratch of the exact NumPy pass, whatever the frames: an upper bound.

    The float64 block and NumPy's temporary of the same size while it converts
    and multiplies (tracemalloc, tests/test_admission.py).  The same for any
    chunk, so a task's need stays linear in its scan rows.
    """
    return 2 * EXACT_BLOCK_BYTES
