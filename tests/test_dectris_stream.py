"""DECTRIS stream v2: the codec, the simulator and the receiver, over loopback."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

pytest.importorskip("zmq")
cbor2 = pytest.importorskip("cbor2")
pytest.importorskip("lz4")

import quantem_flow as qf  # noqa: E402
from quantem_flow.errors import StreamProtocolError, StreamTimeoutError  # noqa: E402
from quantem_flow.streams.dectris_receive import SeriesReport, receive_series  # noqa: E402
from quantem_flow.streams.dectris_sim import DectrisSimulator  # noqa: E402
from quantem_flow.streams.dectris_stream import (  # noqa: E402
    EndMessage,
    ImageMessage,
    StartMessage,
    decode_message,
    encode_end,
    encode_image,
    encode_start,
)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
@pytest.mark.parametrize("compression", ["bslz4", "lz4", None])
def test_images_round_trip_exactly(
    rng: np.random.Generator, dtype: str, compression: str | None
) -> None:
    top = np.iinfo(dtype).max
    frame = rng.integers(0, top, size=(37, 41), dtype=np.uint64).astype(dtype)
    frame[::7] = 0  # runs that compress
    message = decode_message(encode_image(frame, series_id=3, image_id=5, compression=compression))
    assert isinstance(message, ImageMessage)
    assert (message.series_id, message.image_id) == (3, 5)
    out = message.data["threshold_1"]
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, frame)


def test_start_and_end_messages() -> None:
    start = decode_message(
        encode_start(series_id=2, series_unique_id="u", number_of_images=12, image_shape=(192, 192))
    )
    assert isinstance(start, StartMessage)
    assert start.image_shape == (192, 192) and start.number_of_images == 12
    assert start.channels == ("threshold_1",)
    end = decode_message(encode_end(series_id=2, series_unique_id="u"))
    assert isinstance(end, EndMessage) and end.series_id == 2


def _image_with(body: object) -> bytes:
    return bytes(
        cbor2.dumps({"type": "image", "series_id": 1, "image_id": 0, "data": {"threshold_1": body}})
    )


def test_malformed_messages_name_what_was_expected(rng: np.random.Generator) -> None:
    frame = rng.integers(0, 1000, size=(16, 16)).astype(np.uint16)
    good = cbor2.loads(encode_image(frame, series_id=1, image_id=0, compression="bslz4"))
    cases = [
        (b"\xff\x00 not cbor", "not valid CBOR"),
        (bytes(cbor2.dumps([1, 2])), "must be a CBOR map"),
        (bytes(cbor2.dumps({"type": "hello"})), "'start', 'image' or 'end'"),
        (bytes(cbor2.dumps({"type": "start", "series_id": 1})), "image_size_y"),
        (_image_with(b"raw"), "tag 40"),
        (_image_with(cbor2.CBORTag(40, [[16, 16], cbor2.CBORTag(71, b"x" * 512)])), "typed array"),
        (
            _image_with(cbor2.CBORTag(40, [[16, 16], cbor2.CBORTag(69, b"x" * 100)])),
            "needs 512 bytes",
        ),
        (
            _image_with(
                cbor2.CBORTag(
                    40, [[16, 16], cbor2.CBORTag(69, cbor2.CBORTag(56500, ["zip", 0, b"x"]))]
                )
            ),
            "'bslz4', 'lz4'",
        ),
    ]
    body = good["data"]["threshold_1"].value[1].value  # the 56500 tag
    algorithm, size, payload = body.value
    damaged = bytearray(payload)
    damaged[4] ^= 0x40  # the declared uncompressed size
    cases.append(
        (
            _image_with(
                cbor2.CBORTag(
                    40,
                    [
                        [16, 16],
                        cbor2.CBORTag(69, cbor2.CBORTag(56500, [algorithm, size, bytes(damaged)])),
                    ],
                )
            ),
            "bslz4 image is damaged",
        )
    )
    lz4 = cbor2.loads(encode_image(frame, series_id=1, image_id=0, compression="lz4"))
    lz4_body = lz4["data"]["threshold_1"].value[1].value.value[2]
    cut = cbor2.CBORTag(
        40, [[16, 16], cbor2.CBORTag(69, cbor2.CBORTag(56500, ["lz4", 0, lz4_body[:-3]]))]
    )
    cases.append((_image_with(cut), "lz4"))
    for payload_bytes, expected in cases:
        with pytest.raises(StreamProtocolError, match=expected) as err:
            decode_message(payload_bytes)
        assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)


def _frames(rng: np.random.Generator, n: int = 60) -> np.ndarray:
    return rng.poisson(3.0, size=(n, 24, 20)).astype(np.uint16)


def _collect(endpoint: str, **kw: object) -> tuple[dict[int, np.ndarray], SeriesReport]:
    report: list[SeriesReport] = []
    frames = {f.image_id: f.data for f in receive_series(endpoint, report=report, **kw)}  # type: ignore[arg-type]
    return frames, report[0]


def test_a_series_arrives_whole_and_equals_the_offline_pass(rng: np.random.Generator) -> None:
    data = _frames(rng)
    with DectrisSimulator(data, compression="bslz4") as sim:
        assert sim.endpoint.startswith("tcp://127.0.0.1:")
        sim.start()
        got, report = _collect(sim.endpoint, timeout_s=10)
    assert report.complete and report.describe() == "complete: 60 of 60 images"
    assert sorted(got) == list(range(60))
    stacked = np.stack([got[i] for i in range(60)])
    np.testing.assert_array_equal(stacked, data)
    live = qf.open(stacked, scan_shape=(6, 10))
    offline = qf.open(data, scan_shape=(6, 10))
    a = qf.compute(qf.virtual_bf(live, radius=5, center=(12, 10)), client="synchronous")[0]
    b = qf.compute(qf.virtual_bf(offline, radius=5, center=(12, 10)), client="synchronous")[0]
    np.testing.assert_array_equal(a.data, b.data)


def test_dropped_frames_and_a_cut_stream_are_reported_never_silent(
    rng: np.random.Generator,
) -> None:
    data = _frames(rng)
    with DectrisSimulator(data, skip=[7, 8, 30]) as sim:
        sim.start()
        got, report = _collect(sim.endpoint, timeout_s=10)
    assert report.missing == [7, 8, 30] and report.ended and not report.complete
    assert "missing images 7-8, 30" in report.describe()
    assert len(got) == 57
    with DectrisSimulator(data, stop_after=25) as sim:
        sim.start()
        t0 = time.perf_counter()
        got, report = _collect(sim.endpoint, timeout_s=1.0)
        waited = time.perf_counter() - t0
    assert not report.ended and report.reason == "timeout"
    assert report.missing == list(range(25, 60))
    assert (
        "INCOMPLETE: 25 of 60" in report.describe()
        and "no end message (timeout)" in report.describe()
    )
    assert waited < 10  # the deadline ended it


def test_a_damaged_image_is_a_protocol_error_and_silence_a_timeout(
    rng: np.random.Generator,
) -> None:
    data = _frames(rng, n=10)
    with DectrisSimulator(data, corrupt=[4]) as sim:
        sim.start()
        received = []
        with pytest.raises(StreamProtocolError, match="image 4"):
            for frame in receive_series(sim.endpoint, timeout_s=10):
                received.append(frame.image_id)
    assert received == [0, 1, 2, 3]  # what came before is kept
    with DectrisSimulator(data) as sim:  # bound, never started: nothing is sent
        t0 = time.perf_counter()
        with pytest.raises(StreamTimeoutError, match="no DECTRIS stream start message"):
            list(receive_series(sim.endpoint, timeout_s=0.5))
        assert time.perf_counter() - t0 < 5


def test_the_rate_is_kept(rng: np.random.Generator) -> None:
    data = _frames(rng, n=40)
    with DectrisSimulator(data, rate_hz=200.0, compression=None) as sim:
        sim.start()
        t0 = time.perf_counter()
        _, report = _collect(sim.endpoint, timeout_s=10)
        elapsed = time.perf_counter() - t0
    assert report.complete
    assert elapsed >= 39 / 200.0 * 0.9  # not faster than asked


def test_the_simulate_command_serves_a_file(rng: np.random.Generator, tmp_path: object) -> None:
    import subprocess
    import sys
    from pathlib import Path

    data = rng.poisson(2.0, size=(4, 5, 16, 18)).astype(np.uint16)
    path = Path(str(tmp_path)) / "d.npy"
    np.save(path, data)
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantem_flow", "simulate", "dectris", str(path),
         "--bind", "tcp://127.0.0.1:0", "--timeout", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "DECTRIS stream v2 at tcp://127.0.0.1:" in line, line
        import re

        match = re.search(r"at (tcp://127\.0\.0\.1:\d+)", line)
        assert match is not None, line
        got, report = _collect(match.group(1), timeout_s=20)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert report.complete and "sent 20 images" in out
    np.testing.assert_array_equal(np.stack([got[i] for i in range(20)]), data.reshape(20, 16, 18))
