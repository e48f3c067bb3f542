"""qf-worker/1 framing, canonical JSON and messages: a pure state machine, no I/O."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from quantem_flow.errors import ProtocolError
from quantem_flow.representations.packed import Packed
from quantem_flow.representations.paired import Paired
from quantem_flow.runtimes.external import protocol as pr


def _frame(header: bytes, body: bytes = b"", *, body_length: int | None = None) -> bytes:
    pad = pr.pad8(16 + len(header)) - 16 - len(header)
    blen = len(body) if body_length is None else body_length
    return struct.pack("<4sIQ", b"QFW1", len(header), blen) + header + bytes(pad) + body


def _code(data: bytes, **kw: object) -> str:
    with pytest.raises(ProtocolError) as info:
        pr.decode(data, **kw)  # type: ignore[arg-type]
    assert info.value.code is not None
    return info.value.code


# ---------------------------------------------------------------- canonical JSON


def test_canonical_json_matches_python_json_except_del() -> None:
    obj = {"b": [1, -2, None, True, False], "a": {"z": "x\u00e9\U0001f600\n\x01/"}, "A": 0}
    want = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert pr.canonical_json(obj) == want.encode()
    assert pr.canonical_json("\x7f") == b'"\x7f"'  # DEL is ASCII: written raw


def test_canonical_json_rejects_floats_and_big_integers() -> None:
    for bad in (1.5, 1.0, float("nan"), 2**53, -(2**53), {1: 2}, object()):
        with pytest.raises(ProtocolError) as info:
            pr.canonical_json({"x": bad})
        assert info.value.code == "frame"
    assert pr.canonical_json([2**53 - 1, -(2**53 - 1)]) == b"[9007199254740991,-9007199254740991]"
    assert pr.canonical_json(np.int64(5)) == b"5"


def test_header_numbers_value_semantics() -> None:
    assert pr.decode(_frame(b'{"id":1.0,"type":"ping"}')).header["id"] == 1
    assert pr.decode(_frame(b'{"id":1e2,"type":"ping"}')).header["id"] == 100
    assert _code(_frame(b'{"id":1e300,"type":"ping"}')) == "frame"
    assert _code(_frame(b'{"id":Infinity,"type":"ping"}')) == "frame"
    assert _code(_frame(b'{"id":-9007199254740992,"type":"ping"}')) == "frame"
    # receivers accept non-canonical whitespace
    assert pr.decode(_frame(b'{ "type" : "ping", "id" : 3 }')).id == 3


# ---------------------------------------------------------------- framing


def test_round_trip_alignment_and_padding() -> None:
    bufs = [b"", b"a", bytes(range(8)), bytes(9)]
    data = pr.encode(pr.Message({"type": "x", "id": 1}, list(bufs)))
    assert len(data) % 8 == 0
    msg = pr.decode(data)
    assert [bytes(b) for b in msg.buffers] == bufs
    assert msg.header["buffers"] == [0, 1, 8, 9]
    h = struct.unpack("<I", data[4:8])[0]
    start = pr.pad8(16 + h)
    assert struct.unpack("<Q", data[8:16])[0] == len(data) - start == 0 + 8 + 8 + 16


def test_encode_pieces_are_zero_copy() -> None:
    arr = np.arange(10, dtype=np.uint16)
    pieces = pr.encode_pieces(pr.Message({"type": "x", "id": 1}, [arr]))
    view = pieces[1]
    assert isinstance(view, memoryview)
    assert np.shares_memory(np.frombuffer(view, dtype=np.uint8), arr)
    assert pr.Message({"type": "x", "id": 1}, [arr]).nbytes == sum(len(p) for p in pieces)


def test_encode_checks_declared_buffers() -> None:
    with pytest.raises(ProtocolError) as info:
        pr.encode(pr.Message({"type": "x", "id": 1, "buffers": [3]}, [b"ab"]))
    assert info.value.code == "bad_request"
    with pytest.raises(ProtocolError):
        pr.encode(pr.Message({"id": 1}, []))


def test_big_endian_arrays_are_sent_little_endian() -> None:
    arr = np.arange(4, dtype=">u2")
    msg = pr.decode(pr.encode(pr.Message({"type": "x", "id": 1}, [arr])))
    assert bytes(msg.buffers[0]) == np.arange(4, dtype="<u2").tobytes()


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"QFW2" + bytes(12), "frame"),
        (b"Q", "truncated"),
        (b"X", "frame"),
        (b"QFW1" + bytes(4), "truncated"),
        (_frame(b'{"id":1,"type":"ping"}')[:-1] + b"!", "frame"),  # trailing '!' replaces a pad
        (_frame(b'{"type":"ping","buffers":"x"}'), "frame"),
        (_frame(b'{"type":"ping","buffers":[1.5]}'), "frame"),
        (_frame(b'{"type":"ping","buffers":[true]}'), "frame"),
        (_frame(b'"ping"'), "frame"),
        (_frame(b""), "frame"),
        (_frame(b"\xef\xbb\xbf{}"), "frame"),
        (_frame(b'{"type":"ping"}') + b"QFW1", "truncated"),
        (_frame(b'{"type":"ping"}') + _frame(b'{"type":"ping"}'), "frame"),
    ],
)
def test_malformed_frames(data: bytes, code: str) -> None:
    assert _code(data) == code


def test_too_large_before_the_body() -> None:
    data = pr.encode(pr.Message({"type": "x", "id": 1}, [bytes(1000)]))
    assert _code(data[:16], max_message_bytes=100) == "too_large"
    assert pr.decode(data, max_message_bytes=len(data)).type == "x"


def test_header_limit_from_prefix() -> None:
    assert _code(struct.pack("<4sIQ", b"QFW1", 100, 0), max_header_bytes=99) == "frame"


def test_frame_decoder_accepts_any_pieces() -> None:
    frames = [pr.encode(pr.Message({"type": "a", "id": i}, [bytes([i]) * i])) for i in range(6)]
    stream = b"".join(frames)
    for step in (1, 3, 7, 16, 1000):
        dec = pr.FrameDecoder()
        got = []
        for k in range(0, len(stream), step):
            got += dec.feed(stream[k : k + step])
        dec.close()
        assert [m.id for m in got] == list(range(6))
        assert [bytes(m.buffers[0]) if m.buffers else b"" for m in got] == [
            bytes([i]) * i for i in range(6)
        ]
        assert not dec.in_frame


def test_frame_decoder_truncated_and_dead_after_error() -> None:
    data = pr.encode(pr.ping(id=1))
    dec = pr.FrameDecoder()
    assert dec.feed(data[:20]) == []
    assert dec.in_frame and dec.pending == 20
    with pytest.raises(ProtocolError) as info:
        dec.close()
    assert info.value.code == "truncated"
    dec = pr.FrameDecoder()
    with pytest.raises(ProtocolError):
        dec.feed(b"nope")
    with pytest.raises(ProtocolError):
        dec.feed(data)  # a failed stream cannot be resynchronised


def test_lying_body_length_detected_before_the_body() -> None:
    dec = pr.FrameDecoder()
    head = b'{"id":1,"type":"ping"}'
    with pytest.raises(ProtocolError) as info:
        dec.feed(_frame(head, b"", body_length=2**40))
    assert info.value.code == "frame"


# ---------------------------------------------------------------- messages


def _block() -> np.ndarray:
    rng = np.random.default_rng(3)
    return (rng.poisson(0.3, size=(3, 2, 5, 7)) * rng.integers(1, 300, size=(3, 2, 5, 7))).astype(
        np.uint16
    )


def test_put_round_trips_every_schema() -> None:
    block = _block()
    sl = ((6, 9), (0, 2))
    for rep, payload in (
        ("dense", block),
        ("paired", Paired().from_dense(block)),
        ("packed", Packed().from_dense(block, block_values=32)),
    ):
        msg = pr.decode(
            pr.encode(pr.put(id=1, handle=9, representation=rep, payload=payload, scan_slice=sl))
        )
        pr.validate_request(msg)
        got_rep, got, got_sl = pr.parse_put(msg)
        assert got_rep == rep and got_sl == sl
        dense = got if rep == "dense" else (Paired() if rep == "paired" else Packed()).to_dense(got)
        np.testing.assert_array_equal(dense, block)
        assert np.asarray(dense).dtype == np.uint16


def test_put_refuses_what_has_no_schema() -> None:
    with pytest.raises(ProtocolError) as info:
        pr.put(id=1, handle=1, representation="encoded", payload=None, scan_slice=((0, 1), (0, 1)))
    assert info.value.code == "unsupported" and info.value.handle == 1
    p = Paired().from_dense(np.full((1, 1, 2, 2), 2**40, dtype=np.uint64))
    msg = pr.put(id=1, handle=2, representation="paired", payload=p, scan_slice=((0, 1), (0, 1)))
    assert msg.header["count_dtype"] == "uint64"  # 64-bit data need 64-bit counts
    _, back, _ = pr.parse_put(pr.decode(pr.encode(msg)))
    np.testing.assert_array_equal(Paired().to_dense(back), Paired().to_dense(p))


def _put_header(**change: object) -> pr.Message:
    msg = pr.put(
        id=1, handle=4, representation="dense", payload=_block(), scan_slice=((0, 3), (0, 2))
    )
    header = {**msg.header, **change}
    return pr.Message(header, msg.buffers)


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"dtype": "complex64"}, "bad_request"),
        ({"shape": [3, 2, 5]}, "bad_request"),
        ({"shape": [3, 2, 5, 8]}, "bad_request"),
        ({"scan_slice": [[0, 2], [0, 2]]}, "bad_request"),
        ({"scan_slice": [[2, 0], [0, 2]]}, "bad_request"),
        ({"handle": -1}, "bad_request"),
        ({"handle": True}, "bad_request"),
        ({"storage_schema": "dense-v2"}, "unsupported"),
        ({"representation": "encoded"}, "unsupported"),
    ],
)
def test_put_validation(change: dict[str, object], code: str) -> None:
    msg = _put_header(**change)
    with pytest.raises(ProtocolError) as info:
        pr.validate_request(msg)
        pr.parse_put(msg)
    assert info.value.code == code
    assert info.value.message_type == "put"


def test_put_paired_and_packed_buffer_checks() -> None:
    block = _block()
    sl = ((0, 3), (0, 2))
    msg = pr.put(
        id=1, handle=4, representation="paired", payload=Paired().from_dense(block), scan_slice=sl
    )
    short = pr.Message({k: v for k, v in msg.header.items() if k != "buffers"}, msg.buffers[:2])
    with pytest.raises(ProtocolError) as info:
        pr.parse_put(short)
    assert info.value.code == "bad_request" and info.value.handle == 4
    bad_idx = np.array(msg.buffers[1]).copy()
    bad_idx[0] = 35
    with pytest.raises(ProtocolError, match=">= 35 pixels"):
        pr.parse_put(pr.Message(msg.header, [msg.buffers[0], bad_idx, msg.buffers[2]]))
    pk = pr.put(
        id=1, handle=5, representation="packed", payload=Packed().from_dense(block), scan_slice=sl
    )
    with pytest.raises(ProtocolError) as info:
        pr.parse_put(pr.Message(pk.header, [pk.buffers[0], pk.buffers[1], b"\0\0"]))
    assert info.value.code == "bad_request"


def test_weights_run_and_results() -> None:
    w = np.array([[1.0, 0.5], [0.0, -2.0], [3.0, 4.0]])
    msg = pr.decode(pr.encode(pr.put_weights(id=2, handle=7, weights=w)))
    pr.validate_request(msg)
    np.testing.assert_array_equal(pr.parse_put_weights(msg), w)
    empty = pr.decode(pr.encode(pr.put_weights(id=2, handle=7, weights=np.zeros((0, 4)))))
    assert pr.parse_put_weights(empty).shape == (0, 4)
    with pytest.raises(ProtocolError):
        pr.put_weights(id=1, handle=1, weights=np.zeros((2, 2), dtype=np.float32))

    run = pr.decode(
        pr.encode(pr.run_frame_pass(id=3, chunk=1, weights=7, want_sum=True, want_max=False))
    )
    pr.validate_request(run)
    assert run.header["options"] == {"want_sum": True, "want_max": False}
    g = pr.decode(pr.encode(pr.run_gather(id=4, chunk=1, indices=np.array([3, 1]))))
    pr.validate_request(g)
    np.testing.assert_array_equal(pr.parse_run_gather(g), [3, 1])

    per = np.arange(6, dtype=np.float64).reshape(3, 2)
    s = np.arange(4, dtype=np.int64)
    mx = np.arange(4, dtype=np.uint16)
    res = pr.decode(
        pr.encode(
            pr.frame_pass_result(
                id=3, per_frame=per, pattern_sum=s, pattern_max=mx, accumulation="int64"
            )
        )
    )
    out = pr.parse_frame_pass_result(
        res, n_frames=3, n_weights=2, n_pixels=4, dtype=np.uint16, want_sum=True, want_max=True
    )
    np.testing.assert_array_equal(out.per_frame, per)
    np.testing.assert_array_equal(out.pattern_sum, s)
    assert out.pattern_max is not None and out.pattern_max.dtype == np.uint16
    assert out.accumulation == "int64"
    with pytest.raises(ProtocolError, match="were asked for"):
        pr.parse_frame_pass_result(
            res, n_frames=3, n_weights=2, n_pixels=4, dtype=np.uint16, want_sum=True, want_max=False
        )
    with pytest.raises(ProtocolError, match="expected"):
        pr.parse_frame_pass_result(
            res, n_frames=2, n_weights=2, n_pixels=4, dtype=np.uint16, want_sum=True, want_max=True
        )
    vals = np.arange(6, dtype=np.uint8).reshape(3, 2)
    gr = pr.decode(pr.encode(pr.gather_result(id=4, values=vals)))
    np.testing.assert_array_equal(
        pr.parse_gather_result(gr, n_frames=3, n_indices=2, dtype=np.uint8), vals
    )
    with pytest.raises(ProtocolError):
        pr.parse_gather_result(gr, n_frames=3, n_indices=2, dtype=np.uint16)


def test_hello_reply_validation() -> None:
    good = pr.hello_reply(
        id=0,
        runtime="x",
        implementation="y",
        device={"name": "d"},
        limits=dict.fromkeys(
            ("max_message_bytes", "max_buffer_bytes", "max_weights", "max_frame_pixels"), 8
        ),
        memory_budget_bytes=10,
        kernels=[("frame_pass", "dense", "uint16")],
        storage_schemas=["dense-v1"],
        accumulation={"integer": "int64", "real": "float64"},
    )
    info = pr.parse_hello_reply(pr.decode(pr.encode(good)))
    assert info.kernels == (("frame_pass", "dense", "uint16"),)
    assert info.to_dict()["memory_budget_bytes"] == 10
    with pytest.raises(ProtocolError) as exc:
        pr.parse_hello_reply(pr.Message({**good.header, "protocol": "qf-worker/2"}))
    assert exc.value.code == "version"
    for key in ("device", "limits", "kernels", "storage_schemas", "accumulation", "runtime"):
        with pytest.raises(ProtocolError) as exc:
            pr.parse_hello_reply(pr.Message({**good.header, key: 5}))
        assert exc.value.code == "bad_request"


def test_validate_request_types_and_members() -> None:
    with pytest.raises(ProtocolError) as info:
        pr.validate_request(pr.Message({"type": "teleport", "id": 1}))
    assert info.value.code == "unsupported"
    with pytest.raises(ProtocolError) as info:
        pr.validate_request(pr.Message({"type": "run", "id": 1, "operation": "fft", "chunk": 2}))
    assert info.value.code == "unsupported" and info.value.handle == 2
    for msg in (
        pr.Message({"type": "ping"}),
        pr.Message({"type": "release", "id": 1, "handles": [-1]}),
        pr.Message({"type": "run", "id": 1, "operation": "frame_pass", "chunk": 1, "weights": 2}),
        pr.Message(
            {
                "type": "run",
                "id": 1,
                "operation": "frame_pass",
                "chunk": 1,
                "weights": 2,
                "options": {"want_sum": 1, "want_max": False},
            }
        ),
        pr.Message({"type": "run", "id": 1, "operation": "gather", "chunk": 1}),
    ):
        with pytest.raises(ProtocolError) as info:
            pr.validate_request(msg)
        assert info.value.code == "bad_request"
    for msg in (
        pr.ping(id=1),
        pr.bye(id=2),
        pr.stats(id=3),
        pr.release(id=4, handles=[1, 2]),
        pr.hello_request(client="t"),
    ):
        pr.validate_request(pr.decode(pr.encode(msg)))


def test_error_and_replies() -> None:
    e = pr.decode(pr.encode(pr.error(id=None, code="frame", message="m")))
    assert e.id is None and e.header["code"] == "frame" and "handle" not in e.header
    with pytest.raises(ProtocolError):
        pr.error(id=1, code="oops", message="m")
    r = pr.decode(pr.encode(pr.release_result(id=1, released=[2], resident_bytes=0)))
    assert r.header["released"] == [2]
    s = pr.decode(
        pr.encode(
            pr.stats_reply(id=1, handles=0, resident_bytes={"dense": 0}, memory_budget_bytes=5)
        )
    )
    assert s.header["memory_budget_bytes"] == 5


def test_nesting_is_bounded_and_reported_as_frame() -> None:
    def frame(header: bytes) -> bytes:
        pad = -(16 + len(header)) % 8
        return b"QFW1" + struct.pack("<IQ", len(header), 0) + header + bytes(pad)

    deep = b'{"type":"ping","id":1,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(ProtocolError) as info:
        pr.decode(frame(deep))
    assert info.value.code == "frame" and "100001 deep" in str(info.value)
    at_limit = b'{"type":"ping","id":1,"x":' + b"[" * 255 + b"]" * 255 + b"}"
    assert pr.decode(frame(at_limit)).type == "ping"
    # brackets inside strings are text, not nesting
    text = b'{"type":"ping","id":1,"s":"' + b"[{" * 400 + b'"}'
    assert pr.decode(frame(text)).type == "ping"


def test_an_announced_body_is_allocated_as_it_arrives() -> None:
    import tracemalloc

    header = b'{"buffers":[1073741824],"id":1,"type":"result"}'
    pad = -(16 + len(header)) % 8
    prefix = b"QFW1" + struct.pack("<IQ", len(header), 1 << 30) + header + bytes(pad)
    dec = pr.FrameDecoder(max_message_bytes=2 << 30)
    tracemalloc.start()
    try:
        assert dec.feed(prefix) == []
        assert dec.feed(bytes(4096)) == []  # a little of the "1 GiB" body
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * pr.FIRST_BODY_ALLOCATION, f"{peak} bytes for an announced 1 GiB body"
    assert dec.in_frame and dec.pending == len(prefix) + 4096


def test_a_body_in_uneven_pieces_across_buffer_growth_is_intact() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 2**16, size=3_000_000, dtype=np.uint16)  # 6 MB: several doublings
    frame = pr.encode(pr.Message({"type": "result", "id": 2}, [values]))
    dec = pr.FrameDecoder()
    out = []
    pos = 0
    while pos < len(frame):
        step = int(rng.integers(1, 700_000))
        out += dec.feed(frame[pos : pos + step])
        pos += step
    (message,) = out
    np.testing.assert_array_equal(np.frombuffer(message.buffers[0], dtype=np.uint16), values)
