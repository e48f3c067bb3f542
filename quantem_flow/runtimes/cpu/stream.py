"""The CPU runtime's streamed frame pass: one prepared pass fed piece by piece."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import config
from ...representations.base import gather_columns
from ...representations.stored import StoredFrames
from ..base import FramePassResult, FramePassStream, is_gather_only
from ..host_arrays import fresh_zeros

if TYPE_CHECKING:
    from .row_hash import RowHasher

__all__ = ["CpuFramePassStream"]

logger = logging.getLogger("quantem_flow.cpu.stream")


class CpuFramePassStream(FramePassStream):
    """:class:`~quantem_flow.runtimes.cpu.prepared.PreparedFramePass` plus a gather.

    A gather-only stream (no weight rows, no patterns: SSB's first pass)
    runs no frame pass, as the whole-chunk path does.
    """

    def __init__(
        self,
        weights: np.ndarray,
        *,
        n_frames: int,
        frame_shape: tuple[int, int],
        dtype: np.dtype[Any],
        want_sum: bool,
        want_max: bool,
        gather: np.ndarray | None,
        gather_into: np.ndarray | None = None,
    ) -> None:
        self._n = int(n_frames)
        self._gather = None if gather is None else np.asarray(gather, dtype=np.int64)
        # pixel-major: each piece's small gather is transposed while in cache; the chunk's
        # partial wants (pixel, frame) order, which a transpose of the whole chunk's gather
        # (cache-unfriendly, ~7 ms per 128 MiB chunk of SSB's bright field) used to give
        self._in_place = gather_into is not None and self._gather is not None
        if self._in_place:
            assert gather_into is not None and self._gather is not None
            want = (self._gather.size, self._n)
            if gather_into.shape != want or gather_into.dtype != np.dtype(dtype):
                raise ValueError(
                    f"gather_into of {gather_into.dtype} {gather_into.shape}: expected "
                    f"{np.dtype(dtype)} {want}"
                )
        self._gathered = (
            None
            if self._gather is None
            else gather_into
            if self._in_place
            else fresh_zeros((self._gather.size, self._n), np.dtype(dtype))
        )
        skip = is_gather_only(gather, weights, want_sum=want_sum, want_max=want_max)
        if not skip:
            from .prepared import PreparedFramePass  # Numba: not for a gather alone (SSB)
        self._pass = (
            None
            if skip
            else PreparedFramePass(
                weights,
                dtype=np.dtype(dtype),
                n_frames=self._n,
                want_sum=want_sum,
                want_max=want_max,
                frame_shape=frame_shape,
                background_jit=bool(config.get("jit_in_background")),
            )
        )
        self._pos = 0
        self._hasher: RowHasher | None = None

    def hash_rows(self, *, row_frames: int, frame_nbytes: int) -> str | None:
        """Hash scan rows in the integer dot kernel's sweep, where it runs this pass.

        Not taken (``None``) where the dot kernel does not run the pass or a
        frame is not a whole number of XXH3's 1024-byte blocks; the caller
        then hashes each piece itself.
        """
        if self._pos != 0 or self._hasher is not None:
            raise ValueError("hash_rows is asked before the first frames are fed, once")
        if self._pass is None or not self._pass.runs_dot_kernel:
            return None
        from .row_hash import RowHasher, why_not_row_hasher

        if why_not_row_hasher(int(frame_nbytes)) is not None:
            return None
        try:
            self._hasher = RowHasher(row_frames=row_frames, frame_nbytes=frame_nbytes)
        except Exception as exc:  # an llvmlite that cannot compile it: the caller hashes
            logger.warning(
                "quantem-flow: the row hasher could not be compiled (%s: %s); each piece is "
                "hashed in a sweep of its own (the same digest)",
                type(exc).__name__,
                exc,
            )
            return None
        return (
            "XXH3-128 per scan row, each group of four frames hashed by the integer dot "
            "kernel right after its own sweep of them, while in cache (docs/digest-in-kernel.md)"
        )

    def row_digests(self) -> list[str]:
        """The digests of the scan rows finished so far (after :meth:`hash_rows`)."""
        if self._hasher is None:
            raise ValueError("this stream does not hash rows (hash_rows was not taken)")
        return self._hasher.digests()

    def feed(self, frames: np.ndarray) -> None:
        """Run the next ``(n, k_r * k_c)`` frames."""
        n = int(frames.shape[0])
        if self._pos + n > self._n:
            raise ValueError(f"{self._pos + n} frames fed to a stream of {self._n}")
        if self._gather is not None and self._gathered is not None:
            self._gathered[:, self._pos : self._pos + n] = gather_columns(frames, self._gather).T
        if self._pass is not None:
            self._pass.run(frames, hasher=self._hasher)
        self._pos += n

    def feed_stored(self, stored: StoredFrames) -> None:
        """Run the next frames as stored: counted on their bit planes where the pass allows.

        A gather needs the values, so a stream with one decodes every piece.
        """
        if self._gather is not None or self._pass is None:
            for start, stop in stored.pieces():
                self.feed(stored.frames(start, stop).decode())
            return
        n = stored.n_frames
        if self._pos + n > self._n:
            raise ValueError(f"{self._pos + n} frames fed to a stream of {self._n}")
        self._pass.run_stored(stored)
        self._pos += n

    @property
    def can_sweep(self) -> bool:
        """Where the prepared pass runs its compiled kernels (:meth:`PreparedFramePass.sweep`)."""
        return self._pass is not None and self._pass.can_sweep

    def sweep(self, frames: np.ndarray) -> None:
        """Run the prepared pass's kernels over ``frames``, results dropped (a probe's sweep)."""
        if self._pass is None:
            raise NotImplementedError("this stream runs no kernels (can_sweep)")
        self._pass.sweep(frames)

    @property
    def can_stop_early(self) -> bool:
        """Yes: the prepared pass's outputs and the gather are cut to the frames it keeps."""
        return True

    def stop_early(self, n_frames: int) -> None:
        """End after the first ``n_frames`` frames (another stream runs the rest)."""
        n = int(n_frames)
        if not self._pos <= n <= self._n:
            raise ValueError(
                f"a stream of {self._n} frames, {self._pos} fed, cannot stop after {n} frames"
            )
        self._n = n
        if self._pass is not None:
            self._pass.stop_early(n)
        if self._gathered is not None and not self._in_place:
            self._gathered = self._gathered[:, :n]

    def finish(self) -> tuple[FramePassResult, np.ndarray | None]:
        """The pass over every frame, and the gathered values."""
        if self._pos != self._n:
            raise ValueError(f"a stream of {self._n} frames was fed {self._pos}")
        if self._pass is None:
            result = FramePassResult(np.zeros((self._n, 0)), None, None)
        else:
            per_frame, s, m, variant = self._pass.result()
            result = FramePassResult(per_frame, s, m, variant)
        # (frames, pixels) as every gather returns, a view of the pixel-major values; none
        # when they were written into the caller's array
        if self._gathered is None or self._in_place:
            return result, None
        return result, self._gathered.T
