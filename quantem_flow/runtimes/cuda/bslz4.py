"""Bitshuffle+LZ4 pieces decoded on the device (``bslz4.cu``).

The host walks each piece's framing once (:func:`block_table`): a 12-byte
header (uncompressed bytes and block bytes, big-endian), then per block a
big-endian uint32 compressed size and the LZ4 block, the last block holding
``(n % block) - (n % block) % 8`` elements, and the final ``n % 8`` elements
stored raw.  The table drives three kernels: LZ4 block decoding (one thread
per block, into scratch), bit-unshuffling (one thread per output byte) and
raw copies.  :func:`decode_host` runs the same table through a NumPy/Python
mirror of the kernels; the tests check it against the bitshuffle library,
so the layout the kernels assume is verified here even without a GPU.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

from ...errors import CorruptChunkError, DtypeError, UnsupportedOperationError
from ..base import FramePassResult

__all__ = ["BlockTable", "block_table", "decode_host", "frame_pass_encoded_cuda", "subset_table"]

_HEADER = struct.Struct(">QI")
_SIZE = struct.Struct(">I")


@dataclasses.dataclass
class BlockTable:
    """Where every LZ4 block and raw tail of a set of pieces is, and where it decodes to.

    Offsets ``src_*`` index the payload's ``data``; ``dst_*`` index the
    output buffer (pieces back to back in piece order); ``scratch_*`` a
    scratch buffer for the still-shuffled blocks.
    """

    src_off: np.ndarray
    src_len: np.ndarray
    scratch_off: np.ndarray
    n_elem: np.ndarray
    out_off: np.ndarray
    raw_src: np.ndarray
    raw_dst: np.ndarray
    raw_len: np.ndarray
    piece_of_block: np.ndarray
    piece_out: np.ndarray  # output byte offset of each piece (n_pieces + 1,)
    scratch_bytes: int
    absent: np.ndarray  # pieces of length 0 (filled with the fill value)
    piece_of_raw: np.ndarray  # piece of each raw tail
    pieces: np.ndarray  # the pieces the table covers, in output order


def _corrupt(payload: Any, piece: int, why: str) -> CorruptChunkError:
    origin = ""
    if getattr(payload, "piece_origin", None) is not None:
        row = payload.piece_origin[piece]
        origin = f" ({payload.origins[int(row[0])]}, stored chunk {tuple(int(v) for v in row[1:])})"
    return CorruptChunkError(
        f"bitshuffle+LZ4 piece {piece}{origin} is corrupt: {why}; the file may be truncated "
        "or a chunk damaged"
    )


def block_table(payload: Any, pieces: np.ndarray) -> BlockTable:
    """Parse the framing of ``pieces`` (indices) of a bitshuffle-lz4 payload."""
    data = np.asarray(payload.data)
    dt = np.dtype(payload.value_dtype)
    s = dt.itemsize
    k = int(payload.frame_shape[0]) * int(payload.frame_shape[1])
    src_off: list[int] = []
    src_len: list[int] = []
    scratch_off: list[int] = []
    n_elem: list[int] = []
    out_off: list[int] = []
    piece_of: list[int] = []
    raw_src: list[int] = []
    raw_dst: list[int] = []
    raw_len: list[int] = []
    raw_piece: list[int] = []
    piece_out = [0]
    absent: list[int] = []
    scratch = 0
    for p in (int(x) for x in pieces):
        start, end = int(payload.offsets[p]), int(payload.offsets[p + 1])
        n = int(payload.piece_frames[p]) * k
        base = piece_out[-1]
        piece_out.append(base + n * s)
        if end == start:
            absent.append(p)
            continue
        if end - start < _HEADER.size:
            raise _corrupt(payload, p, f"{end - start} bytes, shorter than the 12-byte header")
        nbytes, block_bytes = _HEADER.unpack_from(data[start : start + _HEADER.size].tobytes())
        if nbytes != n * s or block_bytes == 0 or block_bytes % (8 * s):
            raise _corrupt(
                payload,
                p,
                f"header says {nbytes} bytes in blocks of {block_bytes}, expected "
                f"{n * s} bytes in blocks of a multiple of {8 * s}",
            )
        block = block_bytes // s
        pos = start + _HEADER.size
        done = 0
        while done < n - n % 8:
            m = min(block, (n - done) - (n - done) % 8)
            if pos + 4 > end:
                raise _corrupt(payload, p, "block sizes run past the end of the piece")
            (csize,) = _SIZE.unpack_from(data[pos : pos + 4].tobytes())
            pos += 4
            if pos + csize > end:
                raise _corrupt(payload, p, "a block's compressed size runs past the piece")
            src_off.append(pos)
            src_len.append(csize)
            scratch_off.append(scratch)
            n_elem.append(m)
            out_off.append(base + done * s)
            piece_of.append(p)
            scratch += m * s
            pos += csize
            done += m
        left = (n - done) * s
        if pos + left != end:
            raise _corrupt(payload, p, f"{end - pos} bytes after the blocks, expected {left}")
        if left:
            raw_src.append(pos)
            raw_dst.append(base + done * s)
            raw_len.append(left)
            raw_piece.append(p)

    def i64(a: list[int]) -> np.ndarray:
        return np.asarray(a, dtype=np.int64)

    return BlockTable(
        src_off=i64(src_off),
        src_len=np.asarray(src_len, np.int32),
        scratch_off=i64(scratch_off),
        n_elem=np.asarray(n_elem, np.int32),
        out_off=i64(out_off),
        raw_src=i64(raw_src),
        raw_dst=i64(raw_dst),
        raw_len=np.asarray(raw_len, np.int32),
        piece_of_block=i64(piece_of),
        piece_out=i64(piece_out),
        scratch_bytes=scratch,
        absent=i64(absent),
        piece_of_raw=i64(raw_piece),
        pieces=np.asarray(pieces, dtype=np.int64).reshape(-1),
    )


def subset_table(full: BlockTable, pieces: np.ndarray, itemsize: int) -> BlockTable:
    """The table of ``pieces`` (sorted, unique) cut from ``full``, a table of all pieces.

    The same as ``block_table(payload, pieces)`` without reading the
    payload's bytes again: a resident payload's framing is walked once, at
    upload, and each group of frames selects its pieces from that table.
    """
    want = np.asarray(pieces, dtype=np.int64).reshape(-1)
    pos = np.searchsorted(full.pieces, want)
    if pos.size and (pos.max() >= full.pieces.size or np.any(full.pieces[pos] != want)):
        raise ValueError(f"pieces {want.tolist()} are not all in the table")
    sizes = full.piece_out[pos + 1] - full.piece_out[pos]
    piece_out = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    # output offsets move from the piece's place in ``full`` to its place here
    shift = np.zeros(int(full.pieces.max()) + 1 if full.pieces.size else 1, dtype=np.int64)
    shift[want] = piece_out[:-1] - full.piece_out[pos]
    keep = np.isin(full.piece_of_block, want)
    n_elem = full.n_elem[keep]
    scratch_sizes = n_elem.astype(np.int64) * itemsize
    scratch_off = np.concatenate([[0], np.cumsum(scratch_sizes)[:-1]]).astype(np.int64)
    raw = np.isin(full.piece_of_raw, want)
    piece_of = full.piece_of_block[keep]
    piece_raw = full.piece_of_raw[raw]
    return BlockTable(
        src_off=full.src_off[keep],
        src_len=full.src_len[keep],
        scratch_off=scratch_off if n_elem.size else np.zeros(0, np.int64),
        n_elem=n_elem,
        out_off=full.out_off[keep] + shift[piece_of],
        raw_src=full.raw_src[raw],
        raw_dst=full.raw_dst[raw] + shift[piece_raw],
        raw_len=full.raw_len[raw],
        piece_of_block=piece_of,
        piece_out=piece_out,
        scratch_bytes=int(scratch_sizes.sum()),
        absent=full.absent[np.isin(full.absent, want)],
        piece_of_raw=piece_raw,
        pieces=want,
    )


def _lz4_block(src: bytes, out_len: int) -> tuple[bytes, int]:
    """The host mirror of ``qf_lz4_blocks``: returns (bytes, status)."""
    out = bytearray()
    i, n = 0, len(src)
    while i < n:
        token = src[i]
        i += 1
        lit = token >> 4
        if lit == 15:
            while True:
                if i >= n:
                    return bytes(out), 1
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        if i + lit > n or len(out) + lit > out_len:
            return bytes(out), 1
        out += src[i : i + lit]
        i += lit
        if i >= n:
            break
        if i + 2 > n:
            return bytes(out), 1
        offset = src[i] | (src[i + 1] << 8)
        i += 2
        match = token & 15
        if match == 15:
            while True:
                if i >= n:
                    return bytes(out), 1
                b = src[i]
                i += 1
                match += b
                if b != 255:
                    break
        match += 4
        if offset == 0 or offset > len(out) or len(out) + match > out_len:
            return bytes(out), 1
        start = len(out) - offset
        for t in range(match):
            out.append(out[start + t])
    return bytes(out), (0 if len(out) == out_len else 2)


def _unshuffle(rows: np.ndarray, n: int, s: int) -> np.ndarray:
    """The host mirror of ``qf_bitunshuffle`` for one block of ``n`` elements."""
    bits = np.unpackbits(rows, bitorder="little").reshape(s * 8, n)
    return np.packbits(bits.reshape(s, 8, n).transpose(2, 0, 1), axis=2, bitorder="little").ravel()


def decode_host(payload: Any, pieces: np.ndarray, table: BlockTable | None = None) -> np.ndarray:
    """Decode ``pieces`` on the host through the block table (the kernels' mirror).

    ``table`` defaults to ``block_table(payload, pieces)``.
    """
    if table is None:
        table = block_table(payload, pieces)
    data = np.asarray(payload.data)
    s = np.dtype(payload.value_dtype).itemsize
    out = np.zeros(int(table.piece_out[-1]), dtype=np.uint8)
    for b in range(table.src_off.size):
        lo = int(table.src_off[b])
        raw, status = _lz4_block(
            data[lo : lo + int(table.src_len[b])].tobytes(), int(table.n_elem[b]) * s
        )
        if status:
            raise _corrupt(payload, int(table.piece_of_block[b]), f"LZ4 status {status}")
        o = int(table.out_off[b])
        n = int(table.n_elem[b])
        out[o : o + n * s] = _unshuffle(np.frombuffer(raw, np.uint8), n, s)
    for r in range(table.raw_src.size):
        lo, d, ln = int(table.raw_src[r]), int(table.raw_dst[r]), int(table.raw_len[r])
        out[d : d + ln] = data[lo : lo + ln]
    return out.view(payload.value_dtype)


def frame_pass_encoded_cuda(
    payload: Any, weights: np.ndarray, *, want_sum: bool, want_max: bool
) -> FramePassResult:
    """Frame pass on a bitshuffle+LZ4 encoded payload, decoded on the device in groups."""
    import cupy

    from . import _module
    from .grouped import grouped_frame_pass

    if payload.codec != "bitshuffle-lz4":
        raise UnsupportedOperationError(
            f"the CUDA runtime decodes bitshuffle-lz4 pieces; this payload is "
            f"{payload.codec!r}. Use backend='cpu' or convert with codec='bitshuffle-lz4'"
        )
    dt = np.dtype(payload.value_dtype)
    if not dt.isnative:
        raise DtypeError(f"the CUDA decoder needs native byte order, the payload holds {dt.str}")
    crops = []
    for op in payload.post_ops:
        if op.kind != "crop":
            raise UnsupportedOperationError(
                "the CUDA encoded path crops after decoding but does not bin yet; bin before "
                "converting to 'encoded', or use backend='cpu'"
            )
        crops.append(op)
    kr, kc = (int(v) for v in payload.frame_shape)
    k = kr * kc
    n = int(payload.scan_shape[0]) * int(payload.scan_shape[1])
    data = payload.data
    # resident (DevicePayload): the bytes are on the device and the framing was walked at put
    d_data = data if isinstance(data, cupy.ndarray) else cupy.asarray(np.asarray(data), cupy.uint8)
    full = getattr(payload, "extra", {}).get("block_table")
    runs = np.asarray(payload.runs, dtype=np.int64)
    # scan-order frames: (piece, frame within the piece)
    frame_piece = np.repeat(runs[:, 0], runs[:, 2])
    frame_first = (
        np.concatenate([np.arange(f, f + c) for _, f, c in runs])
        if len(runs)
        else (np.zeros(0, np.int64))
    )
    lz4 = _module("bslz4.cu").get_function("qf_lz4_blocks")
    unshuffle = _module("bslz4.cu").get_function("qf_bitunshuffle")
    copy = _module("bslz4.cu").get_function("qf_copy_ranges")
    out_k = k
    if crops:
        r0, r1, c0, c1 = crops[-1].params if len(crops) == 1 else (0, kr, 0, kc)
        if len(crops) > 1:
            raise UnsupportedOperationError("several crops after decoding: combine them first")
        out_k = (r1 - r0) * (c1 - c0)

    def decode(f0: int, f1: int, out: Any) -> None:
        pieces = np.unique(frame_piece[f0:f1])
        if full is not None:
            table = subset_table(full, pieces, dt.itemsize)
        else:
            table = block_table(payload, pieces)
        buf = cupy.empty(int(table.piece_out[-1]), dtype=cupy.uint8)
        if table.absent.size:
            buf.view(dt).fill(payload.fill_value)
        if table.src_off.size:
            scratch = cupy.empty(max(table.scratch_bytes, 1), dtype=cupy.uint8)
            status = cupy.zeros(table.src_off.size, dtype=cupy.int32)
            nb = int(table.src_off.size)
            lz4(
                ((nb + 127) // 128,),
                (128,),
                (
                    d_data,
                    cupy.asarray(table.src_off),
                    cupy.asarray(table.src_len),
                    cupy.asarray(table.scratch_off),
                    cupy.asarray(table.n_elem * dt.itemsize),
                    scratch,
                    status,
                    np.int64(nb),
                ),
            )
            bad = np.flatnonzero(cupy.asnumpy(status))
            if bad.size:
                b = int(bad[0])
                raise _corrupt(
                    payload,
                    int(table.piece_of_block[b]),
                    f"LZ4 block {b} failed (status {int(cupy.asnumpy(status)[b])})",
                )
            unshuffle(
                (64, min(nb, 65535)),
                (256,),
                (
                    scratch,
                    cupy.asarray(table.scratch_off),
                    cupy.asarray(table.n_elem),
                    cupy.asarray(table.out_off),
                    buf,
                    np.int32(dt.itemsize),
                    np.int64(nb),
                ),
            )
        if table.raw_src.size:
            nr = int(table.raw_src.size)
            copy(
                ((nr + 127) // 128,),
                (128,),
                (
                    d_data,
                    cupy.asarray(table.raw_src),
                    cupy.asarray(table.raw_dst),
                    cupy.asarray(table.raw_len),
                    buf,
                    np.int64(nr),
                ),
            )
        frames = buf.view(dt).reshape(-1, k)
        start = {int(p): int(table.piece_out[i]) // (dt.itemsize * k) for i, p in enumerate(pieces)}
        index = np.asarray(
            [
                start[int(p)] + int(f)
                for p, f in zip(frame_piece[f0:f1], frame_first[f0:f1], strict=True)
            ],
            dtype=np.int64,
        )
        chosen = frames[cupy.asarray(index)]
        if crops:
            chosen = chosen.reshape(-1, kr, kc)[:, r0:r1, c0:c1].reshape(-1, out_k)
        out[...] = chosen

    return grouped_frame_pass(n, out_k, dt, decode, weights, want_sum=want_sum, want_max=want_max)
