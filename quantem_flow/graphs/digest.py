"""Content digests of the bytes a pass read (docs/data-integrity.md).

Each chunk task hashes the host payload it loaded, right after loading and
before the runtime receives it, with xxHash XXH3 (128 bits): the digest
names the data exactly, at memory speed.  What is hashed, per
representation:

``dense``
    The decoded array as the kernels receive it: ``(rows, cols, k_r, k_c)``
    C order, in the dataset's dtype and native byte order, after the
    dataset's detector crops and binning.  Hashed per scan row, so that
    the dataset digest does not depend on the chunking.
``dense``, from a source that stores each frame as one bitshuffle + LZ4 chunk
    The stored chunks as read from the file, before any decoding
    (:attr:`~quantem_flow.io.base.Source.stored_frames_codec`): per scan row,
    each frame's stored size (``-1``: never written) and filter flag, then
    its bytes.  A pass may then count masked sums on the stored bit planes
    without decoding anything (docs/bitplane-kernel.md), and every route
    (streamed, whole chunk, persisted, any runtime) hashes the same bytes.
``encoded``
    The compressed pieces as read (``data``) and their index (``offsets``,
    ``piece_frames``, ``runs``), with the codec, value dtype and frame
    shape.  One digest per chunk.
``paired``
    ``indptr``, ``indices`` and ``counts`` with the value dtype and frame
    shape.  One digest per chunk.
``packed``
    ``widths``, ``offsets`` and ``data`` with the value dtype, frame shape
    and block size.  One digest per chunk.

The dataset digest combines the per-unit digests in scan-row order
(:func:`~quantem_flow.provenance.combine_digests`), so it depends neither
on the number of workers nor on the order chunks finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dataset import Dataset4D
from ..provenance import CONTENT_DIGEST_ALGORITHM, combine_digests
from ..representations.stored import StoredFrames

__all__ = [
    "DIGESTED_FIELDS",
    "DenseRowDigests",
    "Units",
    "chunk_digest",
    "dataset_digest",
    "digest_header",
    "hashes_stored",
    "payload_digests",
    "stored_row_units",
]

#: ``[(row_start, row_stop, hex digest)]``: digests of half-open scan-row ranges.
Units = list[tuple[int, int, str]]

#: Payload attributes hashed, in order, for each non-dense representation.
DIGESTED_FIELDS: dict[str, tuple[str, ...]] = {
    "encoded": ("codec", "value_dtype", "frame_shape", "data", "offsets", "piece_frames", "runs"),
    "paired": ("value_dtype", "frame_shape", "indptr", "indices", "counts"),
    "packed": ("value_dtype", "frame_shape", "block_values", "widths", "offsets", "data"),
}

#: What is hashed, per representation (recorded beside the digest).
HASHED: dict[str, str] = {
    "dense": (
        "decoded values as the kernels receive them (after detector crops and binning), "
        "dataset dtype, native byte order, C order, one digest per scan row"
    ),
    "dense, stored": (
        "the stored chunks as read from the file, not decoded (one bitshuffle + LZ4 chunk per "
        "frame: per scan row each frame's stored size and filter flag, then its bytes), before "
        "any detector crop or binning, one digest per scan row"
    ),
    "encoded": "compressed pieces as read with their index (offsets, piece_frames, runs)",
    "paired": "the event arrays indptr, indices and counts as loaded",
    "packed": "the packed arrays widths, offsets and data as loaded",
}


def _array_bytes(a: np.ndarray) -> Any:
    """A contiguous byte view of ``a`` (no copy when it is C-contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def payload_digests(representation: str, payload: Any, rows: tuple[int, int]) -> Units:
    """Hash a host payload that covers scan rows ``rows``.

    Parameters
    ----------
    representation
        ``"dense"``, ``"encoded"``, ``"paired"`` or ``"packed"``.
    payload
        The host payload as loaded (before the runtime's ``put``).
    rows
        Half-open scan-row range of the payload, in dataset rows.

    Returns
    -------
    Units
        For dense payloads one unit per scan row, otherwise one unit for the
        whole chunk.  Another representation's payload (a third-party one)
        hashes every NumPy array attribute, in attribute order.
    """
    import xxhash

    r0, r1 = int(rows[0]), int(rows[1])
    if representation == "dense":
        block = np.asarray(payload)
        if block.shape[0] != r1 - r0:
            raise ValueError(
                f"a dense payload of {block.shape[0]} scan rows cannot cover rows {rows}"
            )
        rows_digests = DenseRowDigests(block.shape[1])
        rows_digests.update((r0, r1), (0, block.shape[1]), block)
        return rows_digests.units
    h = xxhash.xxh3_128()
    fields = DIGESTED_FIELDS.get(representation)
    if fields is None:
        fields = tuple(k for k, v in vars(payload).items() if isinstance(v, np.ndarray))
    for name in fields:
        value = getattr(payload, name)
        h.update(name.encode() + b"=")
        if isinstance(value, np.ndarray):
            h.update(f"{value.dtype.str}{value.shape}:".encode())
            h.update(_array_bytes(value))
        elif isinstance(value, np.dtype):
            h.update(value.str.encode())
        else:
            h.update(repr(value).encode())
        h.update(b";")
    return [(r0, r1, str(h.hexdigest()))]


def hashes_stored(ds: Dataset4D) -> bool:
    """Whether dense passes over ``ds`` hash its source's stored chunks, not decoded values."""
    return ds.representation == "dense" and ds.source.stored_frames_codec is not None


_STORED_TAG = b"quantem-flow stored frames v1;"


def stored_row_units(stored: StoredFrames, rows: tuple[int, int]) -> Units:
    """Digests of whole scan rows ``rows`` whose frames ``stored`` holds in scan order.

    Per row: the values' dtype and the fill value of chunks never written,
    the frames' stored sizes (int64, ``-1`` never written) and filter flags
    (uint8), then each written chunk's bytes in scan order (read as one run
    where the chunks lie back to back).
    """
    import xxhash

    r0, r1 = int(rows[0]), int(rows[1])
    n = stored.n_frames
    if r1 <= r0 or n % (r1 - r0):
        raise ValueError(f"{n} stored frames are not whole scan rows {rows}")
    per = n // (r1 - r0)
    written = stored.starts >= 0
    sizes = np.where(written, stored.sizes, -1).astype("<i8")
    flags = stored.unfiltered.astype(np.uint8)
    ends = stored.starts + stored.sizes
    units: Units = []
    data = stored.data
    # the values' dtype and the fill value of chunks never written are part of what is read
    tag = _STORED_TAG + f"{stored.dtype.str};fill={int(stored.fill)};".encode()
    for i in range(r1 - r0):
        a, b = i * per, (i + 1) * per
        h = xxhash.xxh3_128()
        h.update(tag)
        h.update(sizes[a:b].tobytes())
        h.update(flags[a:b].tobytes())
        idx = a + np.flatnonzero(written[a:b])
        if idx.size:
            # runs of chunks lying back to back in the buffer: one update each
            breaks = np.flatnonzero(stored.starts[idx[1:]] != ends[idx[:-1]]) + 1
            for s, e in zip(np.r_[0, breaks], np.r_[breaks, idx.size], strict=True):
                h.update(data[int(stored.starts[idx[s]]) : int(ends[idx[e - 1]])].data)
        units.append((r0 + i, r0 + i + 1, str(h.hexdigest())))
    return units


class DenseRowDigests:
    """Per-scan-row digests of a dense chunk read in pieces (a streamed pass).

    Equal to :func:`payload_digests` of the whole chunk: each scan row's
    bytes are hashed in order, either whole or as consecutive column ranges
    (XXH3's streaming digest equals its one-shot digest of the same bytes).

    Parameters
    ----------
    n_cols
        Scan columns of the dataset (a row is complete at its last column).
    """

    def __init__(self, n_cols: int) -> None:
        self._n_cols = int(n_cols)
        self._open: tuple[int, int, Any] | None = None  # (row, next column, hasher)
        #: The digests of the rows completed so far.
        self.units: Units = []

    def update(self, rows: tuple[int, int], cols: tuple[int, int], block: np.ndarray) -> None:
        """Hash the piece ``block`` of scan ``rows x cols`` (whole rows, or part of one row).

        Raises
        ------
        ValueError
            When pieces do not come in C order (a row's columns in turn from 0).
        """
        import xxhash

        (r0, r1), (c0, c1) = rows, cols
        if (c0, c1) == (0, self._n_cols) and self._open is None:
            for i in range(r1 - r0):
                digest = xxhash.xxh3_128_hexdigest(_array_bytes(block[i]))
                self.units.append((r0 + i, r0 + i + 1, str(digest)))
            return
        expected = (r0, c0) if self._open is None else self._open[:2]
        if r1 - r0 != 1 or (r0, c0) != expected or (self._open is None and c0 != 0):
            raise ValueError(
                f"piece rows={rows} cols={cols} out of C order (expected row {expected[0]} "
                f"from column {expected[1]})"
            )
        h = xxhash.xxh3_128() if self._open is None else self._open[2]
        h.update(_array_bytes(block))
        if c1 == self._n_cols:
            self.units.append((r0, r1, str(h.hexdigest())))
            self._open = None
        else:
            self._open = (r0, c1, h)


def digest_header(ds: Dataset4D) -> str:
    """What a dataset's digests are of: representation, dtype and shape as loaded."""
    # the stored bytes do not show a detector crop or binning: those are named here
    stored = (
        f"; stored chunks ({ds.source.stored_frames_codec}, {ds.source.dtype.str}) before "
        f"decoding, then detector transforms {[op.to_dict() for op in ds.detector_ops]}"
        if hashes_stored(ds)
        else ""
    )
    return (
        f"quantem-flow content digest v1; {CONTENT_DIGEST_ALGORITHM}; representation "
        f"{ds.representation} ({ds.storage_schema}){stored}; dtype {ds.dtype.str}; shape "
        f"{list(ds.shape)}"
    )


def chunk_digest(units: Units, ds: Dataset4D) -> str:
    """The digest of one chunk's units (recorded per chunk)."""
    return combine_digests(units, header=digest_header(ds))


def dataset_digest(units: Sequence[tuple[int, int, str]], ds: Dataset4D) -> dict[str, Any]:
    """Combine every unit of a pass into the dataset's content digest.

    Parameters
    ----------
    units
        The units of every chunk, in any order.
    ds
        The dataset the pass read.

    Returns
    -------
    dict
        ``algorithm``, ``digest`` (``None`` when some rows were not hashed,
        with ``missing_rows``), ``hashed`` (what), ``unit`` (``"scan row"`` or
        ``"chunk"``), ``chunking_independent`` and, for per-chunk digests, the
        ``chunk_rows`` the digest depends on.
    """
    R = ds.shape[0]
    covered = np.zeros(R, dtype=bool)
    for r0, r1, _ in units:
        covered[r0:r1] = True
    dense = ds.representation == "dense"
    out: dict[str, Any] = {
        "algorithm": CONTENT_DIGEST_ALGORITHM,
        "digest": None,
        "hashed": HASHED.get(
            "dense, stored" if hashes_stored(ds) else ds.representation,
            "every array of the payload as loaded",
        ),
        "unit": "scan row" if dense else "chunk",
        "chunking_independent": dense,
        "header": digest_header(ds),
    }
    if not dense:
        out["chunk_rows"] = ds.chunk_rows
    if not covered.all():
        out["missing_rows"] = np.flatnonzero(~covered)[:20].tolist()
        return out
    out["digest"] = combine_digests(units, header=out["header"])
    return out
