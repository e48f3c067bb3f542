"""Weight maps kept on a cluster between passes, so a pass that repeats them sends their key.

A pass's weight rows (``(n_weights, k_r * k_c)`` float64: 0.66 MB for BF +
ADF + CoM on a 128 x 128 detector) are a data task of their own in its graph,
keyed by their content (:func:`weights_task_key`), and every chunk task
takes them from it.  The runner keeps the future of that task (this
module), newest last, up to ``held_weights_mib`` and :data:`HELD_SETS` sets
per client.  A later pass with the same rows leaves the data task out of
its graph and names the held key: no bytes, and no task to wait for before
its chunk tasks start.  The key is a task's, not scattered data, so a
worker lost with it computes it again elsewhere (its data is its own
definition, kept by the scheduler).

Clusters others run keep the same rule: the futures are the client's.
"""

from __future__ import annotations

import collections
import math
import threading
import weakref
from typing import Any

import numpy as np

from ..errors import ParameterError

__all__ = ["HELD_SETS", "HeldWeights", "held_weights", "held_weights_bytes", "weights_task_key"]

#: Most weight sets a client keeps on its cluster.
HELD_SETS = 8

#: Prefix of the key of a pass's weights task.
WEIGHTS_PREFIX = "qf-weights-"


def weights_task_key(weights: np.ndarray) -> str:
    """The key of the data task holding ``weights``: their shape, dtype and bytes (XXH3-128)."""
    import xxhash

    w = np.ascontiguousarray(weights)
    h = xxhash.xxh3_128(repr((w.shape, w.dtype.str)).encode())
    h.update(w.data.cast("B") if w.size else b"")
    return WEIGHTS_PREFIX + h.hexdigest()


def held_weights_bytes(value: Any = None) -> int:
    """``held_weights_mib`` (or ``value``) in bytes; refuses a negative or non-finite value."""
    from .. import config

    raw = config.get("held_weights_mib") if value is None else value
    try:
        mib = float(raw)
    except (TypeError, ValueError):
        mib = math.nan
    if not math.isfinite(mib) or mib < 0:
        raise ParameterError(
            f"held_weights_mib must be a finite number of MiB >= 0 (0: every pass sends its "
            f"weight maps), got {raw!r}; set it with qf.config.set(held_weights_mib=...)"
        )
    return int(mib * 2**20)


class HeldWeights:
    """The futures of one client's held weights tasks, least recently used first.

    Parameters
    ----------
    capacity_sets
        Most sets held (:data:`HELD_SETS`).
    """

    def __init__(self, capacity_sets: int = HELD_SETS):
        self.capacity_sets = int(capacity_sets)
        self._held: collections.OrderedDict[str, tuple[Any, int]] = collections.OrderedDict()
        self._seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def saw(self, key: str | None) -> None:
        """Note that a pass used the weights ``key`` (the last ``capacity_sets`` are kept)."""
        if key is None:
            return
        with self._lock:
            self._seen[key] = None
            self._seen.move_to_end(key)
            while len(self._seen) > self.capacity_sets:
                self._seen.popitem(last=False)

    def seen(self, key: str) -> bool:
        """Whether one of the last ``capacity_sets`` passes used the weights ``key``."""
        with self._lock:
            return key in self._seen

    def holds(self, key: str) -> bool:
        """Whether ``key``'s task is held, its value on the cluster or on its way there.

        A held key is marked most recent.  A pending task (sent by a pass still
        running, or computed again after its worker was lost) is held; an erred or
        cancelled one (its client closed, say) is released and forgotten.
        """
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                return False
            if entry[0].status not in ("finished", "pending"):
                del self._held[key]
                entry[0].release()
                return False
            self._held.move_to_end(key)
            return True

    def keep(self, future: Any, nbytes: int, *, capacity_bytes: int) -> None:
        """Hold ``future`` (a weights task of ``nbytes``); release the oldest beyond capacity.

        A set larger than ``capacity_bytes`` is not held: its future is released.
        """
        released: list[Any] = []
        with self._lock:
            old = self._held.pop(future.key, None)
            if old is not None and old[0] is not future:
                released.append(old[0])
            if nbytes > capacity_bytes:
                released.append(future)
            else:
                self._held[future.key] = (future, int(nbytes))
            total = sum(n for _, n in self._held.values())
            while self._held and (len(self._held) > self.capacity_sets or total > capacity_bytes):
                _, (gone, n) = self._held.popitem(last=False)
                total -= n
                released.append(gone)
        for f in released:
            f.release()

    def keys(self) -> list[str]:
        """The held keys, least recently used first."""
        with self._lock:
            return list(self._held)

    def clear(self) -> None:
        """Release every held future."""
        with self._lock:
            gone = [f for f, _ in self._held.values()]
            self._held.clear()
        for f in gone:
            f.release()


_BY_CLIENT: weakref.WeakKeyDictionary[Any, HeldWeights] = weakref.WeakKeyDictionary()
_BY_CLIENT_LOCK = threading.Lock()


def held_weights(client: Any) -> HeldWeights:
    """The weights ``client`` holds on its cluster (made on first use)."""
    with _BY_CLIENT_LOCK:
        held = _BY_CLIENT.get(client)
        if held is None:
            held = _BY_CLIENT[client] = HeldWeights()
        return held
