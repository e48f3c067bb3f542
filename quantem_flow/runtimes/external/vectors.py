"""Golden byte vectors of ``qf-worker/1`` (docs/protocol.md, section 5).

``python -m quantem_flow.runtimes.external.vectors docs/protocol/vectors``
writes ``index.json`` and one ``<name>.bin`` per vector.  Everything is
deterministic: running it again reproduces the committed files byte for
byte (a test checks this).  Valid vectors come from the message builders
of :mod:`.protocol`; invalid ones are valid frames with exactly one defect.
"""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from . import protocol as pr

__all__ = ["build_vectors", "main", "write_vectors"]


def _dense_block() -> np.ndarray:
    # (rows, cols, k_r, k_c) = (1, 2, 3, 3) uint16, a few zeros, one large value
    values = [0, 3, 0, 1, 0, 0, 2, 0, 700, 5, 0, 0, 0, 1, 0, 0, 0, 65535]
    return np.array(values, dtype=np.uint16).reshape(1, 2, 3, 3)


def _valid() -> list[tuple[str, str, pr.Message]]:
    from ...representations.packed import Packed
    from ...representations.paired import Paired

    block = _dense_block()
    paired = Paired().from_dense(block)
    packed = Packed().from_dense(block, block_values=32)
    weights = np.array(
        [[1, 0, 0, 0, 1, 0, 0, 0, 1], [0.5, -0.25, 0, 0, 0, 0, 0, 0, -3.0]], dtype=np.float64
    )
    sl = ((4, 5), (0, 2))
    per_frame = np.array([[1.0, -0.75], [65541.0, 2.5]], dtype=np.float64)
    psum = block.reshape(2, 9).sum(axis=0, dtype=np.int64)
    pmax = block.reshape(2, 9).max(axis=0)
    escapes = (
        'quote " backslash \\ slash / controls \b\f\n\r\t \x01\x1f del \x7f '
        "latin \u00e9 greek \u03bb cjk \u65e5 emoji \U0001f600 end"
    )
    return [
        (
            "hello_request",
            "the bridge's first message",
            pr.hello_request(id=0, client="quantem-flow 0.1.0"),
        ),
        (
            "hello_reply",
            "a worker's hello reply with every member",
            pr.hello_reply(
                id=0,
                runtime="webgpu",
                implementation="quantem-flow-web 0.1.0 (node 20, dawn)",
                device={
                    "name": "SwiftShader",
                    "type": "cpu",
                    "backend": "opengles",
                    "vendor_id": 0,
                },
                limits={
                    "max_message_bytes": 1073741824,
                    "max_buffer_bytes": 268435456,
                    "max_weights": 64,
                    "max_frame_pixels": 4194304,
                },
                memory_budget_bytes=2147483648,
                kernels=[
                    ["frame_pass", "dense", "uint16"],
                    ["frame_pass", "paired", "uint16"],
                    ["gather", "dense", "uint16"],
                ],
                storage_schemas=["dense-v1", "paired-csr-v1", "packed-blockwidth-v1"],
                accumulation={"integer": "u32x2", "real": "float32"},
            ),
        ),
        (
            "put_dense_u16",
            "dense-v1 (1, 2, 3, 3) uint16: 36 bytes, 4 bytes of buffer padding",
            pr.put(id=7, handle=3, representation="dense", payload=block, scan_slice=sl),
        ),
        (
            "put_paired",
            "paired-csr-v1 of the same block: indptr int64, indices uint16, counts uint16",
            pr.put(id=8, handle=4, representation="paired", payload=paired, scan_slice=sl),
        ),
        (
            "put_packed",
            "packed-blockwidth-v1 of the same block, block_values 32",
            pr.put(id=9, handle=5, representation="packed", payload=packed, scan_slice=sl),
        ),
        (
            "put_weights",
            "two (2, 9) float64 weight rows, one integer, one real",
            pr.put_weights(id=10, handle=6, weights=weights),
        ),
        (
            "put_weights_empty",
            "zero weight rows: one zero-length buffer",
            pr.put_weights(id=11, handle=7, weights=np.zeros((0, 9), dtype=np.float64)),
        ),
        (
            "run_frame_pass",
            "the fused pass with both pattern reductions",
            pr.run_frame_pass(id=12, chunk=3, weights=6, want_sum=True, want_max=True),
        ),
        (
            "run_gather",
            "gather three flat detector pixels",
            pr.run_gather(id=13, chunk=3, indices=np.array([0, 4, 8], dtype=np.int64)),
        ),
        (
            "result_put",
            "reply to put",
            pr.put_result(id=7, handle=3, resident_bytes=36),
        ),
        (
            "result_put_weights",
            "reply to put_weights",
            pr.put_weights_result(id=10, handle=6, resident_bytes=144, integer_weights=False),
        ),
        (
            "result_frame_pass",
            "reply to run frame_pass with 3 buffers: per_frame, pattern_sum, pattern_max",
            pr.frame_pass_result(
                id=12, per_frame=per_frame, pattern_sum=psum, pattern_max=pmax, accumulation="u32x2"
            ),
        ),
        (
            "result_gather",
            "reply to run gather: values (2, 3) uint16",
            pr.gather_result(id=13, values=block.reshape(2, 9)[:, [0, 4, 8]].copy()),
        ),
        ("release", "free two handles", pr.release(id=14, handles=[3, 6])),
        (
            "result_release",
            "reply to release",
            pr.release_result(id=14, released=[3], resident_bytes=0),
        ),
        ("stats", "ask for resident bytes", pr.stats(id=15)),
        (
            "stats_reply",
            "reply to stats",
            pr.stats_reply(
                id=15,
                handles=2,
                resident_bytes={"dense": 36, "paired": 0, "packed": 40, "weights": 144},
                memory_budget_bytes=2147483648,
            ),
        ),
        ("ping", "ping (the reply is identical)", pr.ping(id=16)),
        ("bye", "bye (the reply is identical)", pr.bye(id=17)),
        (
            "error_unknown_handle",
            "an error naming a handle",
            pr.error(
                id=12,
                code="unknown_handle",
                message="no chunk under handle 3; put the chunk first",
                handle=3,
            ),
        ),
        (
            "error_unsolicited",
            "an unsolicited error (id null) before the worker closes",
            pr.error(id=None, code="frame", message="frame magic is wrong"),
        ),
        (
            "header_escapes",
            "canonical string escapes: quote, backslash, controls, DEL as is, non-ASCII as "
            "lowercase \\uXXXX with surrogate pairs, '/' not escaped",
            pr.error(id=18, code="internal", message=escapes),
        ),
        (
            "negative_integer",
            "a negative integer and the extreme safe integers in unknown extra members",
            pr.Message(
                {
                    "type": "ping",
                    "id": 19,
                    "x_min": -(2**53 - 1),
                    "x_max": 2**53 - 1,
                    "x_neg": -1,
                }
            ),
        ),
    ]


def _frame(header_bytes: bytes, body: bytes, *, body_length: int | None = None) -> bytes:
    n = len(header_bytes)
    blen = len(body) if body_length is None else body_length
    pad = pr.pad8(16 + n) - 16 - n
    return struct.pack("<4sIQ", pr.MAGIC, n, blen) + header_bytes + bytes(pad) + body


def _invalid() -> list[tuple[str, str, bytes, str]]:
    ping = pr.encode(pr.ping(id=1))
    dense = pr.encode(
        pr.put(
            id=7,
            handle=3,
            representation="dense",
            payload=_dense_block(),
            scan_slice=((4, 5), (0, 2)),
        )
    )
    weights = pr.encode(
        pr.put_weights(id=2, handle=1, weights=np.array([[1.0, 2.0]], dtype=np.float64))
    )
    out: list[tuple[str, str, bytes, str]] = []
    out.append(("bad_magic", "magic 'XFW1'", b"X" + ping[1:], "frame"))
    out.append(
        (
            "header_length_over_limit",
            "header_length 16 MiB + 1 (rejected from the prefix alone)",
            struct.pack("<4sIQ", pr.MAGIC, pr.MAX_HEADER_BYTES + 1, 0),
            "frame",
        )
    )
    head = b'{"id":1,"type":"ping"}'
    out.append(
        (
            "body_length_too_long",
            "body_length 8 while the header declares no buffers (the file holds 8 body bytes)",
            _frame(head, bytes(8)),
            "frame",
        )
    )
    head_w = (
        b'{"buffers":[16],"dtype":"float64","handle":1,"id":2,"shape":[1,2],"type":"put_weights"}'
    )
    out.append(
        (
            "body_length_too_short",
            "body_length 8 while the header declares one 16-byte buffer (16 body bytes follow)",
            _frame(head_w, weights[-16:], body_length=8),
            "frame",
        )
    )
    hp = bytearray(ping)
    hlen = struct.unpack("<I", hp[4:8])[0]
    assert pr.pad8(16 + hlen) > 16 + hlen
    hp[16 + hlen] = 1
    out.append(
        ("nonzero_header_padding", "a padding byte after the header is 1", bytes(hp), "frame")
    )
    bp = bytearray(dense)
    bp[-1] = 0x80
    out.append(
        (
            "nonzero_buffer_padding",
            "the last padding byte after the buffer is 0x80",
            bytes(bp),
            "frame",
        )
    )
    out.append(
        (
            "float_in_header",
            "id 1.5: headers hold integers only",
            _frame(b'{"id":1.5,"type":"ping"}', b""),
            "frame",
        )
    )
    out.append(
        ("nan_in_header", "NaN is not JSON", _frame(b'{"id":NaN,"type":"ping"}', b""), "frame")
    )
    out.append(
        (
            "integer_out_of_range",
            "id 2**53 is outside the safe integers",
            _frame(b'{"id":9007199254740992,"type":"ping"}', b""),
            "frame",
        )
    )
    out.append(("header_not_object", "the header is a JSON array", _frame(b"[1,2]", b""), "frame"))
    out.append(("header_not_json", "the header is not JSON", _frame(b"{id:1}", b""), "frame"))
    out.append(("type_missing", "no 'type' member", _frame(b'{"id":1}', b""), "frame"))
    out.append(
        ("type_not_string", "'type' is a number", _frame(b'{"id":1,"type":3}', b""), "frame")
    )
    out.append(
        (
            "buffers_negative",
            "'buffers' holds a negative length",
            _frame(b'{"buffers":[-8],"id":1,"type":"ping"}', b""),
            "frame",
        )
    )
    out.append(
        (
            "invalid_utf8",
            "a header string holds the byte 0xff",
            _frame(b'{"id":1,"type":"p\xffng"}', b""),
            "frame",
        )
    )
    out.append(("truncated_prefix", "the first 10 bytes of a ping", ping[:10], "truncated"))
    out.append(("truncated_header", "a ping cut inside its header", ping[:24], "truncated"))
    out.append(
        (
            "truncated_body",
            "a dense put cut inside its buffer",
            dense[: len(dense) - 20],
            "truncated",
        )
    )
    return out


def build_vectors() -> tuple[dict[str, Any], dict[str, bytes]]:
    """Return ``(index, {file name: frame bytes})`` of every golden vector."""
    entries: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}
    for name, description, message in _valid():
        data = pr.encode(message)
        decoded = pr.decode(data)
        files[f"{name}.bin"] = data
        entries.append(
            {
                "name": name,
                "file": f"{name}.bin",
                "description": description,
                "header": decoded.header,
                "buffers_hex": [bytes(b).hex() for b in decoded.buffers],
            }
        )
    for name, description, data, code in _invalid():
        files[f"{name}.bin"] = data
        entries.append(
            {"name": name, "file": f"{name}.bin", "description": description, "error": code}
        )
    index = {
        "protocol": pr.PROTOCOL,
        "generator": "python -m quantem_flow.runtimes.external.vectors docs/protocol/vectors",
        "vectors": entries,
    }
    return index, files


def index_bytes(index: dict[str, Any]) -> bytes:
    """Return the bytes ``index.json`` is written with (sorted keys, indent 1, ASCII)."""
    return (json.dumps(index, indent=1, sort_keys=True, ensure_ascii=True) + "\n").encode("ascii")


def write_vectors(directory: str | Path) -> list[Path]:
    """Write ``index.json`` and every vector file into ``directory``; return the paths."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    index, files = build_vectors()
    paths = []
    for name, data in files.items():
        path = root / name
        path.write_bytes(data)
        paths.append(path)
    (root / "index.json").write_bytes(index_bytes(index))
    paths.append(root / "index.json")
    return paths


def main(argv: list[str] | None = None) -> int:
    """Command line: write the vectors into the given directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="output directory, e.g. docs/protocol/vectors")
    args = parser.parse_args(argv)
    paths = write_vectors(args.directory)
    print(f"wrote {len(paths)} files to {args.directory}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
