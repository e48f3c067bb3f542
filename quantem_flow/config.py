"""Defaults, environment variables and a ``set()`` context manager.

Every default can be read with :func:`get`, overridden for a block with
:func:`set` and preset through an environment variable
``QUANTEM_FLOW_<NAME>`` (upper case), read once at import.

============================  =========================================  ==========================
name                          meaning                                    default
============================  =========================================  ==========================
``chunk_mib``                 logical (decoded) MiB per chunk            128
``local_workers``             worker processes of the embedded cluster   max(1, min(cores // 8, 4))
``local_threads``             threads per embedded worker                min(cores, 8)
``probe_sample_frames``       frames read to find the probe ("auto")     256
``progress``                  show a progress bar on long work           True
``numba_cache``               cache compiled CPU kernels on disk         True
``gather_memory_mib``         gathered pixels kept in memory, beyond     1024
                              that a temporary file (SSB pass 1)
``decode_threads``            threads decoding the bitshuffle chunks     1
                              of one dense HDF5 read (parallelism
                              comes from the worker's task threads)
``stream_piece_mib``          MiB a streamed chunk pass reads, hashes    2
                              and runs at a time (0: whole chunks;
                              docs/streamed-pass.md); with
                              ``read_method="auto"`` a file read by
                              ``pread`` may be read in pieces up to 4x
                              larger where the worker's probe measured
                              them faster
``map_piece_mib``             MiB a streamed pass maps and runs at a      16
                              time where it reads through a map and its
                              kernel carries the digest (one sweep: the
                              piece need not fit a cache; bounds the
                              mapped pages a task holds)
``pass_tasks_per_thread``     a pass over unpersisted data runs at       2
                              least this many tasks per thread of the
                              cluster, each running whole chunks in
                              turn (graphs/pass_groups.py)
``pass_task_mib``             most logical MiB one such task covers      1024
``share_work``                the tasks of a pass in one process share   True
                              their work: a thread whose chunks are
                              done runs another task's queued chunks,
                              then the tail of a chunk another thread
                              streams (graphs/work_sharing.py)
``read_method``               how a streamed pass reads contiguous       auto
                              frames: ``auto`` (each worker measures a
                              map against ``pread`` on the file),
                              ``mmap`` or ``pread``
                              (io/read_method.py)
``no_worker_timeout_s``       seconds a task may wait for a worker that  60
                              can run it while one may still come (a
                              worker whose restarts gave up is not
                              waited for: the compute fails at once)
``external_timeout_s``        seconds an external worker (webgpu,        30
                              vulkan, swift...) may take to answer a
                              request, plus the time its bytes need at
                              ``external_min_mib_s``; past that it is
                              stalled: killed, restarted, re-run once
``external_min_mib_s``        the slowest rate, MiB/s, an external       1
                              worker is allowed for the bytes of a
                              request (its message and the chunk it
                              runs on)
``external_stall_grace_s``    seconds an external worker's process may   2
                              stay stopped (SIGSTOP, a debugger) during
                              a request before it counts as stalled
``external_hello_timeout_s``  seconds an external worker may take to    60
                              start and answer hello
``complement_queries``        a query on persisted integer chunks reads  True
                              a 0/1 detector covering more than half
                              the frame through its complement (frame
                              total minus the rest; exact, recorded)
``radial_queries``            a disk or annulus query on persisted       True
                              integer chunks reads a radial index kept
                              with each chunk (its pixels sorted by
                              distance from the centre, prefix sums;
                              exact, recorded; graphs/radial_query.py)
``jit_in_background``         a CPU kernel not yet compiled in this      True
                              process compiles in a thread while an
                              exact NumPy form of the pass (bit for
                              bit the same values) runs, where one
                              exists (integer data)
``direct_queries``            a query on persisted chunks goes straight  True
                              to the workers holding them, one message
                              each, not through the scheduler (off: a
                              graph, seen in the task stream)
``direct_passes``             a file pass on a cluster of one worker     True
                              (the embedded default) with no progress
                              bar goes to it in one message, not
                              through the scheduler (off: a graph;
                              graphs/direct_pass.py)
``integer_dot_kernel``        mask and moment rows (BF, ADF, annuli,     True
                              CoM) of 8/16-bit frames run as SIMD
                              integer dot products compiled for this
                              CPU (AVX2 / AVX-512, VNNI where present;
                              exact; runtimes/cpu/dot_pass.py)
``digest_in_kernel``          where the integer dot kernel runs a        True
                              streamed pass, it also hashes each group
                              of frames (the content digest, XXH3-128)
                              right after its sweep, while in cache
                              (docs/digest-in-kernel.md)
``bitplane_kernel``           mask and moment rows of integer frames     True
                              stored one bitshuffle + LZ4 chunk each
                              are counted on the stored bit planes,
                              never decoded (exact;
                              runtimes/cpu/bitplane.py)
``message_batch_ms``          longest a message between the processes    0.5
                              of a cluster quantem-flow starts waits to
                              be batched with others (Dask: 2-10 ms;
                              graphs/message_batching.py)
``held_weights_mib``          MiB of weight maps a client keeps on its   64
                              cluster between passes (the last 8
                              sets): a pass with the same maps sends
                              only their key (graphs/held_weights.py;
                              0: every pass sends its maps)
============================  =========================================  ==========================
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from .errors import ParameterError

__all__ = ["environment", "get", "set", "snapshot"]

_DEFAULTS: dict[str, Any] = {
    "chunk_mib": 128.0,
    # one process using every core up to 8 threads (issue 14: on 2 cores 1 x 2 started in
    # 3.7 s instead of 8.5 s and passed faster than 2 x 1 on most rows; the CPU kernels,
    # preadv reads and bitshuffle decodes release the GIL); docs/architecture-notes.md
    "local_workers": max(1, min((os.cpu_count() or 1) // 8, 4)),
    "local_threads": max(1, min(os.cpu_count() or 1, 8)),
    "probe_sample_frames": 256,
    "progress": True,
    "numba_cache": True,
    "gather_memory_mib": 1024.0,
    # measured (issue 14): two threads inside one read were no faster than one (the bitshuffle
    # binding scales 1.34x on 2 threads, per-chunk Python holds the GIL); docs/architecture-notes
    "decode_threads": 1,
    # measured (issue 14): 2 MiB pieces (64 frames of 128 x 128 u16) beat 8 MiB and whole
    # 128 MiB chunks on 2 threads; benchmarks/RESULTS.md, "Streamed chunk passes"
    "stream_piece_mib": 2.0,
    # issue 24: a piece read through a map and swept once (the digest in the kernel's sweep)
    # need not fit a cache: larger pieces spread each piece's fixed cost (Python, the call,
    # madvise's TLB flush) over more bytes; 2 -> 8-64 MiB measured 1.2x (RESULTS.md, issue 24)
    "map_piece_mib": 16.0,
    # issue 24: a page-cached file's pieces viewed in place through a map (pages dropped after
    # each piece) where that measures faster than pread on the worker
    "read_method": "auto",
    # issue 24: each task costs the embedded cluster ~8 ms; a 2 GiB pass in 4 tasks ran 1.2x
    # faster than in 16 (graphs/pass_groups.py); two per thread let Dask balance the tail
    "pass_tasks_per_thread": 2,
    "pass_task_mib": 1024.0,
    # issue 24: the two threads of a 2 GiB pass finished 3-14 ms apart on a shared VM; a
    # thread whose own chunks are done takes the rest of another's (graphs/work_sharing.py)
    "share_work": True,
    # issue 23: a compute no worker can run fails instead of waiting forever; a worker being
    # restarted (the local cluster's supervisor, a Nanny) is back in a few seconds
    "no_worker_timeout_s": 60.0,
    # issue 23: a stalled external worker (SIGSTOP, a hung driver) is detected well before the
    # old fixed 300 s: a deadline scaled by the request's bytes, and a stopped-process check
    "external_timeout_s": 30.0,
    "external_min_mib_s": 1.0,
    "external_stall_grace_s": 2.0,
    "external_hello_timeout_s": 60.0,
    # issue 24: an ADF ring to the detector edge on resident chunks reads its inner disk
    # (~10 % of the pixels) and subtracts it from cached frame totals; bit for bit the same
    "complement_queries": True,
    # issue 24: persisted disk and annulus queries around one centre read a radial index kept
    # with each resident chunk (pixels in distance order, prefix sums); exact, recorded
    "radial_queries": True,
    # issue 24: ~30 ms of scheduling per resident query on the embedded default, gone
    "direct_queries": True,
    # issue 24, goal 5: a file pass on a one-worker cluster skips Dask's round trip
    "direct_passes": True,
    # issue 24: mask and moment rows of 8/16-bit frames as SIMD integer dot products
    # (pmaddwd / vpdpwssd, LLVM IR compiled in process; runtimes/cpu/dot_pass.py)
    "integer_dot_kernel": True,
    "digest_in_kernel": True,
    # issue 24, goal 6: masked sums of bitshuffle + LZ4 frames from their bit planes, without
    # decoding them (runtimes/cpu/bitplane.py)
    "bitplane_kernel": True,
    # issue 24: a first compute on an empty Numba cache does not wait seconds for the compiler
    # where NumPy gives the same bits (runtimes/cpu/exact_numpy.py)
    "jit_in_background": True,
    # issue 24, goal 5: a pass is a chain of small messages; Dask's 2-10 ms batching intervals
    # were half of a small pass's cost on the embedded default (graphs/message_batching.py)
    "message_batch_ms": 0.5,
    # issue 24: a pass's weight maps (0.66 MB for BF + ADF + CoM at 128 x 128) travel to the
    # cluster once and are kept there; the next pass with them sends a key, and its chunk
    # tasks start without waiting for a spec task (graphs/held_weights.py)
    "held_weights_mib": 64.0,
}


def _coerce(name: str, raw: str) -> Any:
    default = _DEFAULTS[name]
    if isinstance(default, bool):
        return raw.strip().lower() in {"1", "true", "yes", "on"}
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


_values: dict[str, Any] = dict(_DEFAULTS)
for _name in _DEFAULTS:
    _env = os.environ.get(f"QUANTEM_FLOW_{_name.upper()}")
    if _env is not None:
        _values[_name] = _coerce(_name, _env)


def get(name: str) -> Any:
    """Return the current value of a setting.

    Parameters
    ----------
    name
        One of the names in this module's table.

    Returns
    -------
    Any
        The value in force.
    """
    if name not in _values:
        raise ParameterError(
            f"unknown quantem-flow setting {name!r}; known settings: {sorted(_values)}"
        )
    return _values[name]


def snapshot() -> dict[str, Any]:
    """Return a copy of every setting, for provenance."""
    return dict(_values)


@contextlib.contextmanager
def set(**overrides: Any) -> Iterator[None]:
    """Override settings inside a ``with`` block.

    Parameters
    ----------
    **overrides
        ``name=value`` pairs for names in this module's table.

    Examples
    --------
    >>> import quantem_flow as qf
    >>> with qf.config.set(chunk_mib=64):
    ...     pass
    """
    unknown = sorted(k for k in overrides if k not in _values)
    if unknown:
        raise ParameterError(
            f"unknown quantem-flow setting(s) {unknown}; known settings: {sorted(_values)}"
        )
    old = {k: _values[k] for k in overrides}
    _values.update(overrides)
    try:
        yield
    finally:
        _values.update(old)


def environment(overrides: dict[str, Any]) -> dict[str, str]:
    """The ``QUANTEM_FLOW_<NAME>`` variables that give another process these settings.

    Worker processes read them at import (``start_local_cluster(config=...)``,
    ``quantem-flow worker --config NAME=VALUE``).

    Raises
    ------
    ParameterError
        An unknown name, or a value the setting's type cannot hold.
    """
    out: dict[str, str] = {}
    for name, value in overrides.items():
        if name not in _DEFAULTS:
            raise ParameterError(
                f"unknown quantem-flow setting {name!r}; known settings: {sorted(_DEFAULTS)}"
            )
        text = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            _coerce(name, text)
        except ValueError as exc:
            raise ParameterError(
                f"setting {name!r} takes a {type(_DEFAULTS[name]).__name__}, got {value!r}"
            ) from exc
        out[f"QUANTEM_FLOW_{name.upper()}"] = text
    return out
