"""What every runtime adapter provides: the payload contract.

A runtime owns allocation, layout, compilation and synchronisation for one
device class.  It knows nothing of Dask.  Its contract is on chunk
*payloads*, not host arrays:

``put(chunk) -> handle``
    Place a host :class:`~quantem_flow.representations.chunk.Chunk`'s
    payload where the runtime computes (device memory, another process) and
    return the handle: a ``Chunk`` whose ``payload`` lives in the runtime,
    whose ``residency`` is the runtime's (``host``, ``cuda:<n>``, ``mps``,
    ``external:<name>``) and whose ``runtime`` names it.  Host runtimes
    return the same payload.
``run_frame_pass(handle, weights, *, want_sum, want_max) -> FramePassResult``
    The fused pass (per-frame dot products with weight rows, sum and max
    patterns) on the resident payload, results on the host.
``run_gather(handle, indices) -> numpy.ndarray``
    The values of chosen flat detector pixels for every frame, on the host.
``release(handle) -> None``
    Free what ``put`` allocated (idempotent; a no-op on host runtimes).  A
    released handle cannot be run.

Kernels come from the runtime's own tables of callables keyed by
representation (:meth:`Runtime.frame_pass_kernels`,
:meth:`Runtime.gather_kernels`) and are checked against the runtime's
declared ``(operation, representation, dtype)`` triples
(:class:`~quantem_flow.runtimes.registry.RuntimeSpec`): a triple the
runtime does not declare raises
:class:`~quantem_flow.errors.UnsupportedOperationError` naming the runtimes
that declare it.  :meth:`Runtime.frame_pass` stays as the dense host-array
kernel.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import ParameterError, UnsupportedOperationError
from ..representations.base import dense_frames, gather_columns
from ..representations.chunk import Chunk

if TYPE_CHECKING:
    from ..representations.stored import StoredFrames
    from .registry import RuntimeSpec

__all__ = [
    "RELEASED",
    "CompileTime",
    "FramePassKernel",
    "FramePassResult",
    "FramePassStream",
    "GatherKernel",
    "Precision",
    "Runtime",
    "gather_columns",
    "host_gather",
]

#: Integer accumulations that are exact (``u32x2``: two 32-bit words with carry).
EXACT_INTEGER_ACCUMULATIONS = ("int64", "uint64", "u32x2")
REAL_ACCUMULATIONS = ("float64", "float32")


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a runtime accumulates (the ``accumulation`` of the qf-worker/1 ``hello``).

    Attributes
    ----------
    integer
        Accumulator of integer data with integer weights and of integer
        pattern sums: ``"int64"``, ``"uint64"`` or ``"u32x2"`` (two 32-bit
        words with carry, for devices without 64-bit integers).  All three
        are exact; the conformance suite holds every runtime to exactness
        there.
    real
        Accumulator of real products and sums: ``"float64"`` or
        ``"float32"`` (devices without float64, such as WGSL); the
        conformance suite's tolerances follow it.
    """

    integer: str = "int64"
    real: str = "float64"

    def __post_init__(self) -> None:
        if self.integer not in EXACT_INTEGER_ACCUMULATIONS:
            raise ParameterError(
                f"Precision.integer must be one of {list(EXACT_INTEGER_ACCUMULATIONS)} (exact "
                f"integer sums are required), got {self.integer!r}"
            )
        if self.real not in REAL_ACCUMULATIONS:
            raise ParameterError(
                f"Precision.real must be one of {list(REAL_ACCUMULATIONS)}, got {self.real!r}"
            )

    def to_dict(self) -> dict[str, str]:
        """Return a JSON-ready dict (the protocol's ``accumulation``)."""
        return {"integer": self.integer, "real": self.real}


@dataclasses.dataclass
class FramePassResult:
    """What one fused pass over a block of frames returns (always on the host).

    Attributes
    ----------
    per_frame
        ``(n_frames, n_weights)`` float64: the dot product of every frame with
        every weight row.  Integer data with integer weights give exact
        integer values while partial sums stay below 2**53.
    pattern_sum
        ``(k_r * k_c,)`` sum over the frames (int64 for integer data, uint64
        for uint64 data, float64 otherwise), or ``None`` when not requested.
    pattern_max
        ``(k_r * k_c,)`` maximum over the frames in the data's dtype, or
        ``None``.
    variant
        Optional JSON-ready record of the kernel variant that ran and why
        (the CPU runtime's structured or fused pass); it goes into the
        chunk's provenance record as ``frame_pass_variant``.
    """

    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    variant: dict[str, Any] | None = None


@dataclasses.dataclass
class CompileTime:
    """JIT compilation seen while a runtime ran kernels (see :meth:`Runtime.compile_timer`).

    Attributes
    ----------
    seconds
        Seconds this thread spent compiling kernels, loading them from the
        compilation cache, or waiting for another thread's compilation.
    compilations
        Kernel signatures compiled (cache loads and waits not counted).
    """

    seconds: float = 0.0
    compilations: int = 0


_NUMBA_LISTENER: list[Any] = []
#: Held while this module imports Numba and makes its listener: two task threads importing it
#: at once for the first time in a process failed with "partially initialized module
#: 'numba.core.event'" (an external worker's first two chunk tasks, 1 run in 6 on a loaded VM).
_NUMBA_IMPORT = threading.Lock()


def _numba_listener_class() -> Any:
    """The numba event listener class (made once; Numba imported whole, one thread at a time)."""
    with _NUMBA_IMPORT:
        if not _NUMBA_LISTENER:
            _make_numba_listener_class()
        return _NUMBA_LISTENER[0]


def _make_numba_listener_class() -> None:
    import numba  # noqa: F401  (the package before its submodule: no half-made module)
    from numba.core import event

    class ThreadCompileListener(event.Listener):
        """Times numba's compiler lock on one thread (nested holds counted once)."""

        def __init__(self, clock: CompileTime) -> None:
            self.clock = clock
            self.thread = threading.get_ident()
            self.depth = 0
            self.start = 0.0

        def on_start(self, ev: Any) -> None:
            if threading.get_ident() != self.thread:
                return
            if ev.kind == "numba:compile":
                self.clock.compilations += 1
                return
            if self.depth == 0:
                self.start = time.perf_counter()
            self.depth += 1

        def on_end(self, ev: Any) -> None:
            if threading.get_ident() != self.thread or ev.kind == "numba:compile":
                return
            if self.depth == 0:  # its start came before the listener: not timed
                return
            self.depth -= 1
            if self.depth == 0:
                self.clock.seconds += time.perf_counter() - self.start

    _NUMBA_LISTENER.append(ThreadCompileListener)


#: ``kernel(payload, weights, *, want_sum, want_max) -> FramePassResult``
FramePassKernel = Callable[..., FramePassResult]
#: ``kernel(payload, indices) -> (n_frames, len(indices))`` host array in the data's dtype
GatherKernel = Callable[[Any, np.ndarray], np.ndarray]


class _Released:
    """The payload of a released handle (see :meth:`Runtime.release`)."""

    nbytes = 0

    def __repr__(self) -> str:
        return "<released payload>"

    def __reduce__(self) -> str:
        return "RELEASED"


#: What a released handle's payload is replaced with.
RELEASED: Any = _Released()


_frames_of = dense_frames  # the name this layer's modules use


def host_gather(representation: str, payload: Any, indices: np.ndarray) -> np.ndarray:
    """Gather pixels ``indices`` of every frame from a host payload (any representation).

    The representation knows how (:meth:`~quantem_flow.representations.base.Representation.gather`):
    dense payloads are indexed directly, paired payloads scatter their events,
    others are decoded one chunk at a time.
    """
    from ..representations import get_representation

    return get_representation(representation).gather(payload, np.asarray(indices, dtype=np.int64))


def _host_gatherer(representation: str) -> GatherKernel:
    def gather(payload: Any, indices: np.ndarray) -> np.ndarray:
        return host_gather(representation, payload, indices)

    return gather


def is_gather_only(
    gather: np.ndarray | None, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> bool:
    """Whether a pass only gathers pixels (SSB alone): no weight rows, no sum or max pattern."""
    return gather is not None and not (weights.shape[0] or want_sum or want_max)


class FramePassStream(abc.ABC):
    """One chunk's frame pass (and gather) fed host frames piece by piece, in order.

    A streamed chunk pass (docs/streamed-pass.md) reads a chunk in pieces of
    a few MiB into one reused buffer and feeds each piece while it is still
    in the core's cache, instead of loading the whole chunk first.  A
    runtime whose kernels run on host memory returns one from
    :meth:`Runtime.frame_pass_stream`; the result equals
    :meth:`Runtime.run_frame_pass` / :meth:`Runtime.run_gather` on the whole
    chunk (per-frame values do not depend on the split; real-valued sums
    within the runtime's tolerance).
    """

    @abc.abstractmethod
    def feed(self, frames: np.ndarray) -> None:
        """Run the next ``(n, k_r * k_c)`` host frames (views are fine; not kept)."""

    def feed_stored(self, stored: StoredFrames) -> None:
        """Run the next frames as their file stores them (bitshuffle + LZ4, one chunk per frame).

        The default decodes them and calls :meth:`feed`; a runtime that can
        compute on the stored bytes (the CPU runtime's bit-plane kernel)
        overrides it.
        """
        self.feed(stored.decode())

    def hash_rows(self, *, row_frames: int, frame_nbytes: int) -> str | None:
        """Take over the content digest: hash each scan row of the frames fed from now on.

        A runtime whose kernels can carry XXH3-128 in their own sweep of the
        frames (the CPU runtime's integer dot kernel: docs/digest-in-kernel.md)
        returns a line saying how, and :meth:`row_digests` then gives each
        finished row's digest (``xxhash.xxh3_128`` of its bytes, hex).  The
        default, ``None``: the caller hashes the frames itself.  Asked before
        the first :meth:`feed`, at the start of a scan row.
        """
        return None

    def row_digests(self) -> list[str]:
        """The digests of the scan rows finished so far, in order (after :meth:`hash_rows`)."""
        raise NotImplementedError(f"{type(self).__name__} does not hash rows (hash_rows)")

    @property
    def can_sweep(self) -> bool:
        """Whether :meth:`sweep` runs this stream's kernels over frames without feeding them."""
        return False

    def sweep(self, frames: np.ndarray) -> None:
        """Run the kernels :meth:`feed` would run over ``(n, k_r * k_c)`` frames; keep nothing.

        A read-method probe (``io/read_method.py``) sweeps the pieces it reads
        with the pass's own kernels, so that it compares a map with ``pread``
        as the pass will read them: a kernel slower than memory hides what a
        map's reads cost more and leaves the copy as ``pread``'s extra work,
        which a plain sum does not show.  The stream's results do not change.
        Only where :attr:`can_sweep`; the default cannot (the probe then sums
        each piece).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot sweep frames (can_sweep)")

    @property
    def can_stop_early(self) -> bool:
        """Whether :meth:`stop_early` may end this stream before every frame it was made for."""
        return False

    def stop_early(self, n_frames: int) -> None:
        """End the stream after its first ``n_frames`` frames; another stream runs the rest.

        The tasks of a pass share their work (``graphs/work_sharing.py``): a
        thread with nothing left takes the later scan rows of a chunk another
        thread is streaming, and the owner's stream then ends where they
        begin.  :meth:`finish` then gives the pass over those ``n_frames``
        (frames fed so far <= ``n_frames`` <= the frames it was made for).
        Only where :attr:`can_stop_early`; the default cannot.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot stop early (can_stop_early)")

    @abc.abstractmethod
    def finish(self) -> tuple[FramePassResult, np.ndarray | None]:
        """The pass over every frame fed, and the gathered values ``(n, n_pixels)`` or ``None``."""


class Runtime(abc.ABC):
    """A device class that runs kernels on resident payloads (see the module docstring)."""

    name: ClassVar[str] = "abstract"

    # -- availability and declaration -----------------------------------------------------
    @classmethod
    @abc.abstractmethod
    def available(cls) -> tuple[bool, str]:
        """Return whether the runtime can run here, and why not if it cannot."""

    @classmethod
    def auto_eligible(cls) -> tuple[bool, str]:
        """Return whether ``backend="auto"`` may choose this runtime, and why.

        The default is :meth:`available`.  A runtime that runs here but is
        not worth choosing automatically (MLX on its CPU backend is no
        accelerator) says no, with the reason; it still runs when requested
        explicitly.
        """
        return cls.available()

    @classmethod
    def auto_excluded(cls) -> str | None:
        """Why ``backend="auto"`` may skip this runtime without probing it, or ``None``.

        A check that costs nothing (the platform, an environment variable),
        asked before :meth:`available`: a probe that initialises a device
        library is not paid by passes that would never choose the runtime.
        The default excludes nothing.
        """
        return None

    @property
    def declaration(self) -> RuntimeSpec:
        """The :class:`~quantem_flow.runtimes.registry.RuntimeSpec` of this runtime (by name)."""
        from .registry import get_spec

        return get_spec(self.name)

    @property
    def kernels(self) -> frozenset[tuple[str, str, str]]:
        """The ``(operation, representation, dtype)`` triples declared for this runtime."""
        return self.declaration.kernels

    def supports(self, operation: str, representation: str, dtype: Any = None) -> bool:
        """Whether a kernel is declared for ``operation`` on ``representation`` (and ``dtype``)."""
        return self.declaration.supports(operation, representation, dtype)

    def precision(self) -> Precision:
        """How this runtime accumulates (default: exact 64-bit integers, float64 reals)."""
        return Precision()

    @property
    def residency(self) -> str:
        """Where this runtime's payloads live: ``"host"``, ``"cuda:<n>"``, ``"mps"``...

        The default is the declared residency prefix (``"host"`` for host runtimes).
        """
        return self.declaration.residency

    # -- the payload contract --------------------------------------------------------------
    def put(self, chunk: Chunk, *, reload: Callable[[], Any] | None = None) -> Chunk:
        """Place ``chunk``'s payload in this runtime and return the handle.

        Parameters
        ----------
        chunk
            A host chunk (``residency="host"``), or a handle this runtime
            made (returned unchanged).
        reload
            A picklable zero-argument callable giving the same host payload
            again.  Runtimes whose payloads can be lost without the process
            that holds the handle dying (an external worker's native process)
            keep it to re-place the chunk after a restart; in-process runtimes
            ignore it (their payloads die with the Dask worker, which the
            scheduler re-places).

        Returns
        -------
        Chunk
            The handle: the payload where the runtime computes,
            ``residency`` :attr:`residency`, ``runtime`` :attr:`name`.
            ``nbytes`` is the resident payload's bytes.

        Raises
        ------
        UnsupportedOperationError
            The runtime declares no kernel for the chunk's representation and
            dtype (the message names the runtimes that do).
        ParameterError
            ``chunk`` is held by another runtime or was released.
        """
        if not isinstance(chunk, Chunk):
            raise ParameterError(f"put() takes a Chunk, got {type(chunk).__name__}")
        self._check_not_released(chunk, "put")
        dtype = self.payload_dtype(chunk.representation, chunk.payload)
        if not any(rep == chunk.representation and dt == dtype.name for _, rep, dt in self.kernels):
            self._refuse("any operation", chunk.representation, dtype)
        if chunk.runtime == self.name and chunk.residency == self.residency:
            return chunk  # already this runtime's handle
        if chunk.residency != "host":
            raise ParameterError(
                f"put() takes host chunks; this one is resident on {chunk.residency!r} (runtime "
                f"{chunk.runtime!r}). Moving payloads between devices is never done silently: "
                "load it again for this runtime"
            )
        payload = self._put_payload(chunk.representation, chunk.payload)
        if payload is chunk.payload and chunk.runtime == self.name:
            return chunk
        return dataclasses.replace(
            chunk, payload=payload, residency=self.residency, runtime=self.name
        )

    def release(self, chunk: Chunk) -> None:
        """Free what :meth:`put` allocated for ``chunk``; idempotent.

        Host runtimes hold nothing of their own: a no-op.  Device runtimes
        free the payload and mark the handle released (running it raises).
        """
        if not isinstance(chunk, Chunk):
            raise ParameterError(f"release() takes a Chunk, got {type(chunk).__name__}")
        if chunk.residency == "host" or chunk.payload is RELEASED:
            return
        with _RELEASE_LOCK:
            if chunk.payload is RELEASED:
                return
            payload, chunk.payload = chunk.payload, RELEASED
        self._release_payload(chunk.representation, payload)

    def run_frame_pass(
        self, chunk: Chunk, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        """Run the fused pass on a handle's resident payload.

        Parameters
        ----------
        chunk
            A handle from :meth:`put` (a host chunk also works on a host runtime).
        weights
            ``(n_weights, k_r * k_c)`` float64 weight rows (may be 0 rows).
        want_sum, want_max
            Also accumulate the sum / maximum pattern over the frames.

        Returns
        -------
        FramePassResult
            Host arrays.

        Raises
        ------
        UnsupportedOperationError
            No ``frame_pass`` kernel is declared for the chunk's
            representation and dtype (the message names the runtimes that have one).
        ParameterError
            The chunk is another runtime's, or released.
        """
        kernel = self._kernel(chunk, "frame_pass", self.frame_pass_kernels())
        result: FramePassResult = kernel(
            chunk.payload, weights, want_sum=want_sum, want_max=want_max
        )
        return result

    def run_gather(self, chunk: Chunk, indices: np.ndarray) -> np.ndarray:
        """Return the values of flat detector pixels ``indices`` for every frame of a handle.

        Returns a host array ``(n_frames, len(indices))`` in the data's dtype.

        Raises
        ------
        UnsupportedOperationError, ParameterError
            As :meth:`run_frame_pass`.
        """
        kernel = self._kernel(chunk, "gather", self.gather_kernels())
        values: np.ndarray = kernel(chunk.payload, np.asarray(indices, dtype=np.int64))
        return values

    # -- what runtimes provide ---------------------------------------------------------------
    @abc.abstractmethod
    def frame_pass(
        self,
        frames: np.ndarray,
        weights: np.ndarray,
        *,
        want_sum: bool,
        want_max: bool,
    ) -> FramePassResult:
        """Run the fused pass over a dense block of frames (the dense kernel).

        Parameters
        ----------
        frames
            ``(n_frames, k_r * k_c)`` C-contiguous host array (or an array
            already in the runtime's memory).
        weights
            ``(n_weights, k_r * k_c)`` float64 weight rows (may be 0 rows).
        want_sum, want_max
            Also accumulate the sum / maximum pattern over the frames.

        Returns
        -------
        FramePassResult
            Host arrays.
        """

    def frame_pass_kernels(self) -> Mapping[str, FramePassKernel]:
        """``{representation: kernel(payload, weights, *, want_sum, want_max)}``.

        The default has the dense kernel (:meth:`frame_pass` on the payload
        viewed as ``(n_frames, k_r * k_c)``); runtimes add their own.
        """
        return {"dense": self._dense_frame_pass}

    def gather_kernels(self) -> Mapping[str, GatherKernel]:
        """``{representation: kernel(payload, indices)}``.

        The default gathers from host payloads of every representation
        (:func:`host_gather`); device runtimes replace it.
        """
        return {rep: _host_gatherer(rep) for rep in ("dense", "paired", "packed", "encoded")}

    #: Whether :meth:`frame_pass_stream` gives a stream (dense host frames fed in pieces):
    #: a streamed chunk task then holds one piece, not the chunk, which admission counts.
    streams: ClassVar[bool] = False
    #: Whether :meth:`run_gather` may compile kernels (a gather-only pass of a runtime whose
    #: gather compiles nothing runs without :meth:`compile_timer`, which loads Numba).
    gather_compiles: ClassVar[bool] = True

    def frame_pass_cost(
        self,
        weights: np.ndarray,
        *,
        dtype: np.dtype[Any],
        frame_shape: tuple[int, int] | None,
    ) -> float | None:
        """Estimated work per frame of :meth:`frame_pass` with ``weights``, or ``None``.

        Comparable between weight stacks over the same frames (not a time);
        a caller that can ask for the same values two ways runs the cheaper
        (:mod:`quantem_flow.graphs.complement_query`).  ``None``: this runtime
        has no model, and callers keep their own rule.
        """
        return None

    def frame_pass_stream(
        self,
        weights: np.ndarray,
        *,
        n_frames: int,
        frame_shape: tuple[int, int],
        dtype: np.dtype[Any],
        want_sum: bool,
        want_max: bool,
        gather: np.ndarray | None = None,
        gather_into: np.ndarray | None = None,
    ) -> FramePassStream | None:
        """A pass over ``n_frames`` dense host frames fed in pieces, or ``None``.

        Parameters
        ----------
        weights
            ``(n_weights, k_r * k_c)`` float64 weight rows (may be 0 rows).
        n_frames
            Frames that will be fed in total.
        frame_shape
            ``(k_r, k_c)`` of the frames.
        dtype
            The frames' dtype.
        want_sum, want_max
            Also accumulate the sum / maximum pattern.
        gather
            Sorted flat detector pixels to gather from every frame, or ``None``.
        gather_into
            A host ``(n_pixels, n_frames)`` array (a strided view is allowed)
            to write the gathered values into, or ``None``.  A stream that
            does so gives ``None`` for them from ``finish``; one that returns
            its own values instead is copied by the caller (either is right).

        Returns
        -------
        FramePassStream or None
            ``None`` (the default) when the runtime's kernels do not run on
            host frames in place; the chunk is then loaded whole and
            :meth:`put` as before.
        """
        return None

    def payload_dtype(self, representation: str, payload: Any) -> np.dtype[Any]:
        """The logical dtype of ``payload``'s values (native byte order)."""
        dtype: np.dtype[Any] = np.dtype(payload.dtype)
        return dtype.newbyteorder("=")

    def _put_payload(self, representation: str, payload: Any) -> Any:
        """Move a host payload into the runtime (default: host runtimes keep it)."""
        return payload

    def _release_payload(self, representation: str, payload: Any) -> None:
        """Free a payload :meth:`_put_payload` made (default: drop the reference)."""
        return None

    def to_host_array(self, array: Any) -> Any:
        """Return ``array`` as a host array (identity on host runtimes)."""
        to_host = getattr(self, "to_host", None)
        return to_host(array) if to_host is not None else array

    def describe(self) -> dict[str, Any]:
        """Return a JSON-ready description for provenance."""
        return {"runtime": self.name}

    @contextlib.contextmanager
    def compile_timer(self) -> Iterator[CompileTime]:
        """Measure the JIT compilation done on this thread inside the ``with`` block.

        The first call of a Numba kernel for a new signature compiles it (or
        loads it from the compilation cache) before it runs; callers subtract
        :attr:`CompileTime.seconds` from the time of the block so that the
        kernel time of the first chunk compares with the others.  The
        default listens to Numba's compiler-lock events on the calling thread
        (other threads' compilations are not counted; a wait for the lock is
        counted, it is compilation this thread needed).  Runtimes that
        compile otherwise override it; runtimes that compile nothing
        measurable report 0.

        Yields
        ------
        CompileTime
            Filled in when the block ends.
        """
        clock = CompileTime()
        listener = _numba_listener_class()(clock)  # Numba is whole from here on
        from numba.core import event

        with (
            event.install_listener("numba:compiler_lock", listener),
            event.install_listener("numba:compile", listener),
        ):
            yield clock

    # -- internals ---------------------------------------------------------------------------
    def _dense_frame_pass(
        self, payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
    ) -> FramePassResult:
        n, k = _frames_of(payload)
        return self.frame_pass(payload.reshape(n, k), weights, want_sum=want_sum, want_max=want_max)

    def _check_not_released(self, chunk: Chunk, what: str) -> None:
        if chunk.payload is RELEASED:
            raise ParameterError(
                f"{what}() on a released chunk (rows {chunk.scan_slice[0]} of runtime "
                f"{chunk.runtime!r}); its payload was freed. Load and put it again"
            )

    def _check_handle(self, chunk: Chunk, what: str) -> None:
        if not isinstance(chunk, Chunk):
            raise ParameterError(
                f"{what}() takes a Chunk handle from put(), got {type(chunk).__name__}"
            )
        self._check_not_released(chunk, what)
        mine = chunk.runtime == self.name and chunk.residency == self.residency
        host_readable = self.residency == "host" and chunk.residency == "host"
        if not (mine or host_readable):
            raise ParameterError(
                f"{what}() on runtime {self.name!r} got a chunk resident on {chunk.residency!r} "
                f"(runtime {chunk.runtime!r}); run it on {chunk.runtime!r}, or put a host copy "
                f"with runtime {self.name!r} first"
            )

    def _refuse(self, operation: str, representation: str, dtype: np.dtype[Any]) -> None:
        from .registry import runtime_specs

        if operation == "any operation":
            able = [
                n
                for n, s in runtime_specs().items()
                if any(rep == representation and d == dtype.name for _, rep, d in s.kernels)
            ]
            offered = sorted({d for _, rep, d in self.kernels if rep == representation})
        else:
            specs = runtime_specs().items()
            able = [n for n, s in specs if s.supports(operation, representation, dtype)]
            offered = list(self.declaration.dtypes(operation, representation))
        raise UnsupportedOperationError(
            f"runtime {self.name!r} has no {operation!r} kernel for {representation!r} "
            f"{dtype.name} payloads"
            + (f" (it takes {offered})" if offered else "")
            + f"; runtimes that do: {able}"
        )

    def _kernel(self, chunk: Chunk, operation: str, table: Mapping[str, Any]) -> Any:
        self._check_handle(chunk, f"run_{operation}")
        dtype = self.payload_dtype(chunk.representation, chunk.payload)
        if not self.supports(operation, chunk.representation, dtype):
            self._refuse(operation, chunk.representation, dtype)
        kernel = table.get(chunk.representation)
        if kernel is None:
            raise UnsupportedOperationError(
                f"runtime {self.name!r} declares {operation!r} on {chunk.representation!r} but "
                f"its kernel table has only {sorted(table)}; the declaration "
                f"({self.declaration.origin}) and the runtime disagree"
            )
        return kernel


_RELEASE_LOCK = threading.Lock()
