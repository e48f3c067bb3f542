"""A CPU frame pass prepared once and run on frames block by block.

:func:`~quantem_flow.runtimes.cpu.kernels.frame_pass_variant` runs a whole
block at once; a streamed chunk pass (docs/streamed-pass.md) feeds the same
chunk as pieces of a few MiB, each read into a reused buffer and passed to
the kernels while it is still in the core's cache.  Both go through
:class:`PreparedFramePass`, so the variant chosen, the accumulators and the
non-finite repair are the same code: the weight stack is analysed once
(:func:`~quantem_flow.runtimes.cpu.structure.analyse_weights`), the outputs
and pattern accumulators are allocated once, and every call of :meth:`run`
writes the next frames' outputs in place.

Per-frame outputs do not depend on how frames are split into calls: every
kernel computes each frame's dot products on its own, and short groups of
frames are summed by the same code, in the same order, as full ones (the
fused kernel fills empty slots with zero frames; the structured kernel pads
a short group of general rows): tests/test_streamed_pass.py checks every
split, real data included.  Pattern sums are integer or
float64 sums in frame order, maxima are exact.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...representations.stored import StoredFrames
from . import warmup
from .exact_numpy import ExactPass
from .kernels import _fused, skip_zero_weights, sum_dtype
from .row_hash import RowHasher

__all__ = ["PreparedFramePass"]


@dataclasses.dataclass(frozen=True)
class _WeightState:
    """What a pass makes of its weight rows, shared by every pass of the same rows."""

    padded: np.ndarray
    plan: Any
    variant: dict[str, Any]
    dot: Any
    #: the structure analysis it was made from (None: none was made)
    analysed: Any = None


#: The last few weight states, keyed by the rows' XXH3-128 and how they are run: a streamed
#: pass prepares one pass per chunk with the same rows (0.7 ms each, cache-cold, before).
_STATES: OrderedDict[tuple[Any, ...], _WeightState] = OrderedDict()
_STATES_LOCK = threading.Lock()
_STATES_KEPT = 16


def _weight_state(
    w: np.ndarray,
    dtype: np.dtype[Any],
    want_sum: bool,
    want_max: bool,
    frame_shape: tuple[int, int] | None,
    structured: bool | None,
) -> _WeightState:
    """The padded rows, the structure plan, the variant and the dot pass of ``w`` (cached).

    Keyed by the rows' content (XXH3-128, one sweep) and every input of the choice,
    the ``integer_dot_kernel`` setting included; nothing in a state is written after.
    A state whose structure analysis left :func:`~.structure.analyse_weights`'s own
    cache (evicted, or cleared where its tunables changed) is made again.
    """
    import xxhash

    from ... import config

    key = (
        xxhash.xxh3_128_digest(w.reshape(-1).view(np.uint8).data),  # C-contiguous float64
        w.shape,
        dtype.str,
        want_sum,
        want_max,
        None if frame_shape is None else tuple(frame_shape),
        structured,
        bool(config.get("integer_dot_kernel")),
    )
    with _STATES_LOCK:
        hit = _STATES.get(key)
        if hit is not None and _still_current(hit, dtype, want_patterns=want_sum or want_max):
            _STATES.move_to_end(key)
            return hit
    state = _make_weight_state(
        w, dtype, want_patterns=want_sum or want_max, frame_shape=frame_shape, structured=structured
    )
    with _STATES_LOCK:
        _STATES[key] = state
        while len(_STATES) > _STATES_KEPT:
            _STATES.popitem(last=False)
    return state


def _still_current(state: _WeightState, dtype: np.dtype[Any], *, want_patterns: bool) -> bool:
    """Whether the analysis and the dot pass a state was made from are still the ones cached.

    Their own caches are cleared where their tunables change (tests do): the state is
    then made again, as a pass would have made it.
    """
    from . import structure

    if state.analysed is not None and not structure.holds_plan(state.analysed):
        return False
    if state.plan is not None:
        from .dot_pass import holds_pass

        return holds_pass(state.plan, dtype, want_patterns=want_patterns, dot=state.dot)
    return True


def _make_weight_state(
    w: np.ndarray,
    dtype: np.dtype[Any],
    *,
    want_patterns: bool,
    frame_shape: tuple[int, int] | None,
    structured: bool | None,
) -> _WeightState:
    from .structure import analyse_weights

    m, k = w.shape
    # the fused kernel and the non-finite repair read weight rows in pairs
    padded = np.concatenate([w, np.zeros((1, k))]) if m % 2 else w.copy()
    plan: Any = None
    found: Any = None
    variant: dict[str, Any] = {"variant": "fused", "summary": f"fused: {m} general rows"}
    if structured is False or m == 0:
        variant["why"] = "asked for" if m else "no weight rows"
    else:
        found = analyse_weights(w, frame_shape=frame_shape, force=bool(structured))
        variant = found.describe(dtype)
        if variant["variant"] == "structured":
            plan = found
    dot: Any = None
    if plan is not None:
        from .dot_pass import dot_pass_for

        dot, why = dot_pass_for(plan, dtype, want_patterns=want_patterns)
        variant["kernel"] = why if dot is not None else f"cell kernels ({why})"
        if dot is not None:
            variant["summary"] += f"; integer dot products ({dot.isa.instruction})"
    return _WeightState(padded=padded, plan=plan, variant=variant, dot=dot, analysed=found)


class PreparedFramePass:
    """The CPU frame pass over ``n_frames`` frames of ``dtype``, fed in order.

    Parameters
    ----------
    weights
        ``(m, k_r * k_c)`` weight rows (converted to float64 once).
    dtype
        The frames' dtype (float16 frames are widened to float32 per call,
        exactly, as Numba has no float16 arithmetic).
    n_frames
        Frames that will be fed in total.
    want_sum, want_max
        Accumulate the sum / maximum pattern.
    frame_shape
        ``(k_r, k_c)``: lets moment rows be recognised.
    structured
        ``None`` (the structured kernel when its estimate wins), ``True`` or
        ``False`` (see :func:`~quantem_flow.runtimes.cpu.kernels.frame_pass_numba`).
    background_jit
        When the compiled kernel this pass needs has not run in this process yet,
        compile it in a background thread and, if the pass has an exact NumPy form
        (:mod:`~quantem_flow.runtimes.cpu.exact_numpy`, bit for bit the same
        values), run that meanwhile (variant ``exact-numpy``).
    """

    def __init__(
        self,
        weights: np.ndarray,
        *,
        dtype: np.dtype[Any],
        n_frames: int,
        want_sum: bool,
        want_max: bool,
        frame_shape: tuple[int, int] | None = None,
        structured: bool | None = None,
        background_jit: bool = False,
    ) -> None:
        self._max_dtype = np.dtype(dtype)
        self._dtype = np.dtype(np.float32) if self._max_dtype == np.float16 else self._max_dtype
        w = np.ascontiguousarray(weights, dtype=np.float64)
        m, k = w.shape
        self._m = m
        self._want_sum = bool(want_sum)
        self._want_max = bool(want_max)
        self._sum = np.zeros(k if want_sum else 1, dtype=sum_dtype(self._dtype))
        if want_max:
            if self._dtype.kind == "f":
                self._max = np.full(k, -np.inf, dtype=self._dtype)
            else:
                self._max = np.full(k, np.iinfo(self._dtype.type).min, dtype=self._dtype)
        else:
            self._max = np.zeros(1, dtype=self._dtype)
        state = _weight_state(
            w, self._dtype, self._want_sum, self._want_max, frame_shape, structured
        )
        self._padded = state.padded
        self._plan: Any = state.plan
        self.variant: dict[str, Any] = dict(state.variant)  # first uses add to it: this pass's
        self._dot: Any = state.dot
        width = self._padded.shape[0]
        if self._plan is not None:  # moment rows' sums go after the rows (finish_moment_rows)
            width = max(width, self._plan.n_out)
        self._out = np.empty((int(n_frames), width), dtype=np.float64)
        self._pos = 0
        self._stored: tuple[Any, str] | None = None  # (bit-plane pass or None, why): first use
        self._decoded: np.ndarray | None = None
        self.kernel_key = self._kernel_key()
        self._exact: ExactPass | None = None
        self._scratch = threading.local()  # sweep()'s outputs, per calling thread
        self._background_jit = bool(background_jit)
        if background_jit and self._dot is None and not warmup.is_ready(self.kernel_key):
            self._start_background(w, frame_shape, structured)

    def _kernel_key(self) -> tuple[Any, ...]:
        """The compiled specialisation this pass runs (see :mod:`.warmup`)."""
        from .structure import integer_mode

        if self._plan is None:
            return ("fused", self._dtype.str)
        if self._dot is not None:  # compiled in process in ~0.1 s, no Numba
            return ("dot", self._dtype.str)
        fused = bool(self._plan.general.size or self._want_sum or self._want_max)
        return (
            "structured",
            integer_mode(self._dtype, self._plan),
            bool(self._plan.need_moments),
            fused,
            self._dtype.str,
        )

    def _start_background(
        self, w: np.ndarray, frame_shape: tuple[int, int] | None, structured: bool | None
    ) -> None:
        from .exact_numpy import exact_pass

        k = w.shape[1]
        exact = exact_pass(w, dtype=self._dtype, plan=self._plan)
        dtype, want_sum, want_max = self._dtype, self._want_sum, self._want_max

        def warm() -> None:  # the same pass on four zero frames: compiles this specialisation
            p = PreparedFramePass(
                w,
                dtype=dtype,
                n_frames=4,
                want_sum=want_sum,
                want_max=want_max,
                frame_shape=frame_shape,
                structured=structured,
            )
            p.run(np.zeros((4, k), dtype=dtype))

        warmup.start(self.kernel_key, warm)
        if exact is None:
            return  # no exact NumPy form: this pass waits for the compiled kernel
        self._exact = exact
        self.variant = {
            "variant": "exact-numpy",
            "summary": f"exact NumPy float64 products ({exact.vectors.shape[1]} vectors)",
            "why": (
                "the compiled kernel for this pass had not run in this process (an empty "
                "Numba cache compiles it for seconds): it compiles in a background thread "
                "while this chunk runs the same sums as float64 matrix products of integer "
                "data and integer vectors, every value exact below 2**53 (moment rows finished "
                "as in the compiled path), so the values are the compiled kernel's bit for bit"
            ),
            "compiled_variant": self.variant,
        }

    @property
    def frames_done(self) -> int:
        """Frames run so far."""
        return self._pos

    @property
    def runs_dot_kernel(self) -> bool:
        """Whether the next frames of the prepared dtype run the integer dot kernel."""
        return self._dot is not None and self._exact is None

    @property
    def can_sweep(self) -> bool:
        """Whether :meth:`sweep` runs this pass's compiled kernels.

        The integer dot kernel, the structured cell kernels or the fused kernel,
        on frames of the pass's own dtype; not while an exact-NumPy stand-in
        runs, nor for float16 frames (widened per call).
        """
        return self._exact is None and self._max_dtype == self._dtype

    def sweep(self, frames: np.ndarray) -> None:
        """Run the kernels :meth:`run` would run over ``(n, k_r * k_c)`` frames, results dropped.

        What a read-method probe sweeps each piece with (``io/read_method.py``):
        the same instructions over the same bytes, into scratch outputs of the
        calling thread, so nothing of the pass changes.  Frames of another dtype
        than the pass's, or a pass without :attr:`can_sweep`, raise ``ValueError``.
        """
        from .structure import readonly, structured_pass

        if not self.can_sweep or frames.dtype != self._dtype:
            raise ValueError(
                f"this pass cannot sweep {frames.dtype} frames (prepared for {self._dtype}, "
                f"compiled kernels: {self.can_sweep})"
            )
        frames = np.ascontiguousarray(frames)
        n = frames.shape[0]
        scratch = getattr(self._scratch, "out", None)
        if scratch is None or scratch.shape[0] < n:
            scratch = self._scratch.out = np.empty((n, self._out.shape[1]), dtype=np.float64)
            self._scratch.sum = np.zeros_like(self._sum)
            self._scratch.max = np.zeros_like(self._max)
        if self._dot is not None:
            self._dot.run(frames, scratch[:n])
        elif self._plan is not None:
            structured_pass(
                frames,
                self._plan,
                scratch[:n],
                self._scratch.sum,
                self._scratch.max,
                do_sum=self._want_sum,
                do_max=self._want_max,
            )
        else:
            _fused(
                readonly(frames),
                self._padded,
                scratch[:n],
                self._scratch.sum,
                self._scratch.max,
                self._want_sum,
                self._want_max,
            )

    def run(self, frames: np.ndarray, *, hasher: RowHasher | None = None) -> None:
        """Run the pass on the next ``(n, k_r * k_c)`` frames (any layout; copied if needed).

        ``hasher``: the frames' scan-row digests advance too, in the integer
        dot kernel's sweep where it runs them, else in a sweep of their own.
        """
        from .structure import readonly, structured_pass

        frames = np.ascontiguousarray(frames)
        if hasher is not None and not (self.runs_dot_kernel and frames.dtype == self._dtype):
            hasher.update(frames)  # no dot kernel to carry the hash: a sweep of its own
            hasher = None
        if frames.dtype == np.float16:
            frames = frames.astype(np.float32)
        n = frames.shape[0]
        if frames.ndim != 2 or frames.shape[1] != self._padded.shape[1]:
            raise ShapeError(
                f"frames of shape {frames.shape} fed to a pass prepared for "
                f"{self._padded.shape[1]} pixels per frame (weights {self._padded.shape[1]} wide)"
            )
        if self._pos + n > self._out.shape[0]:
            raise ValueError(
                f"{self._pos + n} frames fed to a pass prepared for {self._out.shape[0]}"
            )
        out = self._out[self._pos : self._pos + n]
        m = self._m
        if self._exact is not None:
            self._exact.run(frames, out)
            if n and self._want_sum:
                self._sum += frames.sum(axis=0, dtype=self._sum.dtype)
            if n and self._want_max:
                np.maximum(self._max, frames.max(axis=0), out=self._max)
            self._pos += n
            return
        if self._dot is not None and frames.dtype != self._dtype:
            self._dot = None  # the dot pass was made for the prepared dtype only
            self.variant["kernel"] = (
                f"cell kernels (frames arrived as {frames.dtype.str}, the integer dot pass was "
                f"prepared for {self._dtype.str})"
            )
        if self._dot is not None:
            self._dot.run(frames, out, hasher=hasher)
        elif self._plan is not None:
            structured_pass(
                frames,
                self._plan,
                out,
                self._sum,
                self._max,
                do_sum=self._want_sum,
                do_max=self._want_max,
            )
            if frames.dtype.kind == "f" and not np.isfinite(out[:, :m]).all():
                skip_zero_weights(frames, self._padded, out, m)
        else:
            frames = readonly(frames)  # one specialisation whatever the frames' origin
            _fused(frames, self._padded, out, self._sum, self._max, self._want_sum, self._want_max)
            skip_zero_weights(frames, self._padded, out, m)
        warmup.mark_ready(self.kernel_key)
        self._pos += n

    def run_stored(self, stored: StoredFrames) -> None:
        """Run the pass on the next frames as their file stores them (bitshuffle + LZ4).

        Mask and moment rows are counted on the stored bit planes without
        decoding (:mod:`~quantem_flow.runtimes.cpu.bitplane`) where
        :func:`~quantem_flow.runtimes.cpu.bitplane.bitplane_pass_for` takes the
        pass; otherwise the frames are decoded into a reused buffer and run as
        :meth:`run` runs them.  The variant record says which, and why.
        """
        n = stored.n_frames
        if self._pos + n > self._out.shape[0]:
            raise ValueError(
                f"{self._pos + n} frames fed to a pass prepared for {self._out.shape[0]}"
            )
        if self._stored is None:
            self._stored = self._choose_stored(stored)
        bitplane = self._stored[0]
        if bitplane is not None and stored.dtype == bitplane.dtype:
            bitplane.run(stored, self._out[self._pos : self._pos + n])
            warmup.mark_ready(bitplane.warmup_key)
            self._pos += n
            return
        # decoded a cache-sized piece at a time into one reused buffer, each run while in cache
        k = stored.frame_elements
        for a, b in stored.pieces():
            if (
                self._decoded is None
                or self._decoded.dtype != stored.dtype
                or self._decoded.shape[0] < b - a
            ):
                self._decoded = np.empty((b - a, k), dtype=stored.dtype)
            self.run(stored.frames(a, b).decode(self._decoded[: b - a]))

    def _choose_stored(self, stored: StoredFrames) -> tuple[Any, str]:
        """The bit-plane pass for stored frames, or ``None``; the variant records the choice."""
        from .bitplane import BITPLANE_KEY, bitplane_pass_for, warm_bitplane

        if self._plan is None:
            why = "bit-plane kernel: the pass has no structured rows"
            found = None
        elif stored.dtype != self._dtype:
            why = f"bit-plane kernel: stored {stored.dtype} frames, the pass is for {self._dtype}"
            found = None
        else:
            found, why = bitplane_pass_for(
                self._plan, stored.dtype, want_patterns=self._want_sum or self._want_max
            )
        if found is not None and self._background_jit and not warmup.is_ready(BITPLANE_KEY):
            # its first use in this process (an empty Numba cache compiles it for ~1.7 s): it
            # compiles in a background thread, this chunk decodes (the same values)
            warmup.start(BITPLANE_KEY, warm_bitplane)
            self.variant["stored"] = (
                "decoded, then the kernels below, while the bit-plane kernel compiles in a "
                "background thread (its first use in this process); later chunks count on the "
                f"bit planes ({why})"
            )
            return None, why
        if found is not None:
            # the plan's own record (not the exact NumPy stand-in's, nor the dot kernel's)
            self.variant = self._plan.describe(self._dtype)
            self._exact = None
            self.variant["kernel"] = why
            self.variant["summary"] += "; bit-plane counts on the stored chunks"
        else:
            self.variant["stored"] = f"decoded, then the kernels below ({why})"
        return found, why

    def stop_early(self, n_frames: int) -> None:
        """Prepared for ``n_frames`` frames from now on (at least those run so far)."""
        n = int(n_frames)
        if not self._pos <= n <= self._out.shape[0]:
            raise ValueError(
                f"the pass was prepared for {self._out.shape[0]} frames and ran {self._pos}: "
                f"it cannot stop after {n}"
            )
        self._out = self._out[:n]

    def result(
        self,
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, dict[str, Any]]:
        """``(per_frame (n, m), pattern sum, pattern max, variant)`` once every frame ran."""
        if self._pos != self._out.shape[0]:
            raise ValueError(
                f"the pass was prepared for {self._out.shape[0]} frames but {self._pos} were fed"
            )
        # exact: maxima of values of the frames' own dtype
        peak = self._max.astype(self._max_dtype) if self._want_max else None
        return (
            self._out[:, : self._m],
            self._sum if self._want_sum else None,
            peak,
            self.variant,
        )
