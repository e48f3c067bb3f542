"""Merlin over TCP: framing, the acquisition header, frames parsed by the .mib reader's code."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import quantem_flow as qf
from quantem_flow.errors import StreamProtocolError, StreamTimeoutError
from quantem_flow.io.merlin import parse_mib_header
from quantem_flow.streams.merlin_tcp import MerlinSimulator, encode_mpx, mq1_header, receive_merlin


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32"])
def test_an_acquisition_arrives_whole(rng: np.random.Generator, dtype: str) -> None:
    frames = rng.integers(0, min(np.iinfo(dtype).max, 4000), size=(30, 32, 36)).astype(dtype)
    header: list[dict[str, str]] = []
    with MerlinSimulator(frames) as sim:
        sim.start()
        got = list(receive_merlin(sim.host, sim.port, timeout_s=1.0, header=header))
    assert [f.image_id for f in got] == list(range(30))
    np.testing.assert_array_equal(np.stack([f.data for f in got]), frames)
    assert got[0].data.dtype == np.dtype(dtype) and got[0].data.dtype.isnative
    assert header[0]["Frames in Acquisition (Number)"] == "30"


def test_the_length_counts_the_comma_before_the_payload() -> None:
    # as Merlins send it (and LiberTEM-live, run against them, reads it)
    assert encode_mpx(b"HDR,abc") == b"MPX,0000000008,HDR,abc"


def test_the_frame_header_is_the_mib_readers() -> None:
    head = parse_mib_header(mq1_header(7, (256, 256), np.uint16), __import__("pathlib").Path("x"))
    assert (head["sequence_number"], head["header_bytes"], head["width"], head["height"]) == (
        7, 384, 256, 256,
    )  # fmt: skip
    assert head["pixel_depth"] == "U16" and head["n_chips"] == 1


def _serve(messages: list[bytes], *, hold_s: float = 0.0) -> tuple[int, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            for m in messages:
                conn.sendall(m)
            time.sleep(hold_s)
        server.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return port, t


def test_malformed_streams_and_silence(rng: np.random.Generator) -> None:
    hdr = encode_mpx(b"HDR,\t\nEnd\t\n")
    frame = rng.integers(0, 100, size=(8, 8)).astype(np.uint16)
    good = encode_mpx(mq1_header(1, (8, 8), np.uint16) + frame.astype(">u2").tobytes())
    cases = [
        ([b"MPY,0000000010,HDR,\t\nEnd\t"], "expected a message prefix"),
        ([encode_mpx(b"MQ1,000001")], "must be the acquisition header"),
        ([hdr, encode_mpx(b"XYZ" * 200)], "frame 0"),
        (
            [hdr, encode_mpx(mq1_header(1, (8, 8), np.uint16) + b"\x00" * 10)],
            "carries 10 pixel bytes",
        ),
        ([hdr, good, encode_mpx(mq1_header(2, (8, 9), np.uint16) + b"\x00" * 144)], "layout"),
    ]
    for messages, expected in cases:
        port, t = _serve(messages)
        with pytest.raises(StreamProtocolError, match=expected):
            list(receive_merlin("127.0.0.1", port, timeout_s=2.0))
        t.join(5)
    # silence inside a message: a deadline, not a hang
    port, t = _serve([hdr, good[:100]], hold_s=3.0)
    t0 = time.perf_counter()
    with pytest.raises(StreamTimeoutError, match=r"sent nothing for 0\.5 s"):
        list(receive_merlin("127.0.0.1", port, timeout_s=0.5))
    assert time.perf_counter() - t0 < 3.0
    t.join(5)
    # nothing listening
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(StreamTimeoutError, match="could not connect"):
        list(receive_merlin("127.0.0.1", free, connect_timeout_s=1.0))


def test_a_readout_that_stops_early_is_reported_incomplete(rng: np.random.Generator) -> None:
    frames = rng.integers(0, 100, size=(10, 8, 8)).astype(np.uint16)
    hdr = encode_mpx(b"HDR,\t\nFrames in Acquisition (Number):\t10\nEnd\t\n")
    messages = [hdr] + [
        encode_mpx(mq1_header(i + 1, (8, 8), np.uint16) + frames[i].astype(">u2").tobytes())
        for i in range(6)
    ]
    port, t = _serve(messages, hold_s=2.0)
    status: list[dict[str, object]] = []
    got = list(receive_merlin("127.0.0.1", port, timeout_s=0.5, status=status))
    t.join(5)
    assert len(got) == 6
    assert status == [{"expected": 10, "received": 6, "ended": "timeout"}]
    # a frame cut inside its bytes is a protocol error, not an end
    port, t = _serve([hdr, messages[1], messages[2][:50]])
    with pytest.raises(StreamProtocolError, match="closed while reading a message"):
        list(receive_merlin("127.0.0.1", port, timeout_s=2.0))
    t.join(5)


def test_the_simulate_command_serves_merlin(rng: np.random.Generator, tmp_path: object) -> None:
    import re
    import subprocess
    import sys
    from pathlib import Path

    data = rng.integers(0, 4000, size=(3, 4, 16, 16)).astype(np.uint16)
    path = Path(str(tmp_path)) / "m.npy"
    np.save(path, data)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantem_flow", "simulate", "merlin", str(path),
         "--bind", f"tcp://127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.search(rf"Merlin TCP data socket at tcp://127\.0\.0\.1:{port}", line), line
        got = list(receive_merlin("127.0.0.1", port, timeout_s=10))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "sent 12 frames" in out
    np.testing.assert_array_equal(np.stack([f.data for f in got]), data.reshape(12, 16, 16))


@pytest.mark.parametrize(
    ("counter_depth", "quad"),
    [(1, False), (6, False), (12, False), (24, False), (1, True), (6, True), (12, True)],
)
def test_raw_mode_frames_single_chip_and_quad_arrive_as_the_mib_reader_reads_them(
    rng: np.random.Generator, tmp_path: Path, counter_depth: int, quad: bool
) -> None:
    from tests.io.writers_mib import write_raw_mib, write_raw_quad_mib

    top = {1: 1, 6: 63, 12: 4095, 24: 2**24 - 1}[counter_depth]
    side = 128 if quad else 32  # a 1-bit quad chip's row must fill 64-bit words
    frames = rng.integers(0, top + 1, size=(6, side, side)).astype(np.uint32)
    path = tmp_path / "raw.mib"
    if quad:
        write_raw_quad_mib(path, frames, counter_depth=counter_depth)
    else:
        write_raw_mib(path, frames, counter_depth=counter_depth)
    blob = path.read_bytes()
    record = len(blob) // len(frames)
    header = f"HDR,\t\nFrames in Acquisition (Number):\t{len(frames)}\nEnd\t\n".encode("ascii")
    messages = [encode_mpx(header)] + [
        encode_mpx(blob[i * record : (i + 1) * record]) for i in range(len(frames))
    ]
    port, t = _serve(messages)
    status: list[dict[str, object]] = []
    got = list(receive_merlin("127.0.0.1", port, timeout_s=5, status=status))
    t.join(10)
    assert status[0]["ended"] == "complete"
    offline = qf.open(path, scan_shape=(2, 3)).load_block((0, 2)).reshape(-1, side, side)
    for i, f in enumerate(got):
        assert f.image_id == i
        np.testing.assert_array_equal(f.data, frames[i])  # the independent writer's values
        np.testing.assert_array_equal(f.data, offline[i])  # and the file reader's


def test_raw_multi_chip_layouts_other_than_quads_are_refused(tmp_path: Path) -> None:
    from tests.io.writers_mib import raw_header

    head = raw_header(1, width=64, height=16, counter_depth=12, size=768, n_chips=2)
    payload = head + bytes(16 * 64 * 2)
    header = b"HDR,\t\nFrames in Acquisition (Number):\t1\nEnd\t\n"
    port, t = _serve([encode_mpx(header), encode_mpx(payload)])
    with pytest.raises(StreamProtocolError, match=r"2-chip sensor.*only single chips and 2x2"):
        list(receive_merlin("127.0.0.1", port, timeout_s=5))
    t.join(10)
