"""The reference worker over pipes: the session, every bad input, and a killed process."""

from __future__ import annotations

import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from quantem_flow.errors import (
    ExternalWorkerError,
    ExternalWorkerLostError,
    ExternalWorkerTimeoutError,
    ProtocolError,
    RuntimeUnavailableError,
)
from quantem_flow.runtimes.external import protocol as pr
from quantem_flow.runtimes.external.reference_worker import ReferenceWorker
from quantem_flow.runtimes.external.session import ExternalSession
from quantem_flow.runtimes.external.transport import PipeConnection

Start = Callable[..., PipeConnection]
BLOCK = np.arange(2 * 3 * 4 * 5, dtype=np.uint16).reshape(2, 3, 4, 5)
SL = ((0, 2), (0, 3))


def _session(start: Start, *args: str) -> ExternalSession:
    return ExternalSession(lambda: start(*args), name="ref-test", timeout=20, hello_timeout=60)


def _write_raw(conn: PipeConnection, data: bytes) -> None:
    os.set_blocking(conn._stdin_fd, True)
    os.write(conn._stdin_fd, data)


def test_hello_and_round_trip(pipes: Start) -> None:
    s = _session(pipes)
    info = s.start()
    assert info.runtime == "external-reference" and info.memory_budget_bytes == 1 << 30
    assert ("frame_pass", "packed", "uint16") in info.kernels
    handle, gen, nbytes = s.put(representation="dense", payload=BLOCK, scan_slice=SL)
    assert (gen, nbytes) == (1, BLOCK.nbytes)
    wh, _, wbytes, integer = s.put_weights(np.ones((2, 20)))
    assert integer and wbytes == 320
    out = s.run_frame_pass(
        chunk=handle,
        weights=wh,
        generation=gen,
        n_frames=6,
        n_weights=2,
        n_pixels=20,
        dtype=np.uint16,
        want_sum=True,
        want_max=True,
    )
    np.testing.assert_array_equal(out.per_frame[:, 0], BLOCK.reshape(6, 20).sum(axis=1))
    np.testing.assert_array_equal(out.pattern_sum, BLOCK.reshape(6, 20).sum(axis=0))
    assert out.accumulation == "int64"
    vals = s.run_gather(
        chunk=handle, generation=gen, indices=np.array([19, 0]), n_frames=6, dtype=np.uint16
    )
    np.testing.assert_array_equal(vals, BLOCK.reshape(6, 20)[:, [19, 0]])
    assert s.stats()["resident_bytes"]["dense"] == BLOCK.nbytes
    assert s.ping() < 5
    assert s.release([handle, 999]) == [handle]
    assert s.release([handle]) == []  # idempotent
    assert s.stats()["resident_bytes"]["dense"] == 0
    conn = s.connection
    s.close()
    assert conn is not None and not conn.alive and conn.exit_code == 0


def test_wrong_version(pipes: Start) -> None:
    conn = pipes()
    conn.send(pr.hello_request(client="t", protocol="qf-worker/9"))
    reply = conn.recv(60)
    assert reply.type == "error" and reply.header["code"] == "version"
    assert "qf-worker/1" in reply.header["message"]
    conn.process.wait(timeout=10)
    assert conn.exit_code == 3


def test_session_reports_version_error(pipes: Start) -> None:
    # a worker that speaks another version answers hello with its own
    class Old(ReferenceWorker):
        def hello(self) -> pr.Message:
            msg = super().hello()
            msg.header["protocol"] = "qf-worker/0"
            return msg

    reply = Old().handle(pr.hello_request(client="t"))
    with pytest.raises(ProtocolError) as info:
        pr.parse_hello_reply(reply)
    assert info.value.code == "version"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (pr.encode(pr.ping(id=1))[:-3], "truncated"),
        (
            b"QFW1" + struct.pack("<IQ", 22, 64) + b'{"id":1,"type":"ping"}' + bytes(2) + bytes(64),
            "frame",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n", "frame"),
    ],
    ids=["truncated", "lying_body_length", "not_a_frame"],
)
def test_bad_frames_from_the_bridge(pipes: Start, data: bytes, code: str) -> None:
    conn = pipes()
    conn.send(pr.hello_request(client="t"))
    assert conn.recv(60).type == "hello"
    _write_raw(conn, data)
    if code == "truncated":
        assert conn.process.stdin is not None
        conn.process.stdin.close()  # EOF inside the frame
    reply = conn.recv(20)
    assert reply.type == "error" and reply.id is None and reply.header["code"] == code
    conn.process.wait(timeout=10)
    assert conn.exit_code == 2


def test_too_large(pipes: Start) -> None:
    s = _session(pipes, "--max-message-bytes", "1000")
    assert s.start().limits["max_message_bytes"] == 1000
    big = np.zeros((1, 1, 40, 40), np.uint8)
    # the bridge knows the limit from hello and never sends such a frame
    with pytest.raises(ProtocolError) as info:
        s.put(representation="dense", payload=big, scan_slice=((0, 1), (0, 1)))
    assert info.value.code == "too_large" and info.value.worker == "ref-test"
    assert "smaller chunks" in str(info.value) and s.connected and s.generation == 1
    # a peer that sends one anyway gets too_large, and the worker closes
    conn = s.connection
    assert conn is not None
    conn.send(
        pr.put(id=99, handle=9, representation="dense", payload=big, scan_slice=((0, 1), (0, 1)))
    )
    reply = conn.recv(20)
    assert reply.type == "error" and reply.header["code"] == "too_large" and reply.id is None
    conn.process.wait(timeout=10)  # type: ignore[attr-defined]
    assert conn.exit_code == 2  # type: ignore[attr-defined]
    assert s.ping() >= 0 and s.generation == 2  # the next request restarts it


def test_unknown_handle_and_bad_requests(pipes: Start) -> None:
    s = _session(pipes)
    s.start()
    with pytest.raises(ExternalWorkerError) as info:
        s.run_frame_pass(
            chunk=42,
            weights=7,
            generation=1,
            n_frames=1,
            n_weights=0,
            n_pixels=1,
            dtype=np.uint8,
            want_sum=False,
            want_max=False,
        )
    err = info.value
    assert (err.code, err.handle, err.worker, err.message_type) == (
        "unknown_handle",
        42,
        "ref-test",
        "run",
    )
    assert "put the chunk first" in str(err)
    handle, gen, _ = s.put(representation="dense", payload=BLOCK, scan_slice=SL)
    with pytest.raises(ExternalWorkerError) as info:
        s.run_frame_pass(
            chunk=handle,
            weights=99,
            generation=gen,
            n_frames=6,
            n_weights=0,
            n_pixels=20,
            dtype=np.uint16,
            want_sum=False,
            want_max=False,
        )
    assert info.value.code == "unknown_handle" and info.value.handle == 99
    # a put whose buffer disagrees with its shape: bad_request, nothing stored
    bad = pr.put(id=0, handle=0, representation="dense", payload=BLOCK, scan_slice=SL)
    header = {k: v for k, v in bad.header.items() if k not in ("id", "handle", "buffers")}
    with pytest.raises(ProtocolError) as info:
        s.request(lambda i: pr.Message({**header, "id": i, "handle": 50}, [bytes(10)]), handle=50)
    assert info.value.code == "bad_request" and info.value.handle == 50
    # a handle used twice
    with pytest.raises(ProtocolError) as info:
        s.request(
            lambda i: pr.put(
                id=i, handle=handle, representation="dense", payload=BLOCK, scan_slice=SL
            ),
            handle=handle,
        )
    assert info.value.code == "bad_request" and "already in use" in str(info.value)
    # an unknown message type
    with pytest.raises(ExternalWorkerError) as info:
        s.request(lambda i: pr.Message({"type": "teleport", "id": i}))
    assert info.value.code == "unsupported"
    assert s.stats()["handles"] == 1 and s.connected  # the worker stays usable


def test_over_budget_allocates_nothing(pipes: Start) -> None:
    s = _session(pipes, "--budget-bytes", str(BLOCK.nbytes + 10))
    assert s.start().memory_budget_bytes == BLOCK.nbytes + 10
    s.put(representation="dense", payload=BLOCK, scan_slice=SL)
    with pytest.raises(ExternalWorkerError) as info:
        s.put(representation="dense", payload=BLOCK, scan_slice=SL)
    assert info.value.code == "budget" and "does not fit" in str(info.value)
    assert info.value.handle is not None
    stats = s.stats()
    assert stats["handles"] == 1 and stats["resident_bytes"]["dense"] == BLOCK.nbytes


def test_killed_mid_request_then_restart(pipes: Start) -> None:
    s = _session(pipes, "--run-delay", "30")
    s.start()
    handle, gen, _ = s.put(representation="dense", payload=BLOCK, scan_slice=SL)
    wh, _, _, _ = s.put_weights(np.ones((1, 20)))
    pid = s.pid
    assert pid is not None
    timer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(ExternalWorkerLostError) as info:
        s.run_frame_pass(
            chunk=handle,
            weights=wh,
            generation=gen,
            n_frames=6,
            n_weights=1,
            n_pixels=20,
            dtype=np.uint16,
            want_sum=False,
            want_max=False,
        )
    timer.join()
    assert time.monotonic() - t0 < 15  # process death wakes the read, no hang
    err = info.value
    assert err.exit_code == -signal.SIGKILL and err.message_type == "run" and err.handle == handle
    assert (
        "SIGKILL" in str(err) and "ref-test" in str(err) and "reference worker" in err.stderr_tail
    )
    assert s.losses and s.losses[-1]["message_type"] == "run"
    # the old handle is refused without being sent; a new request restarts the worker
    with pytest.raises(ExternalWorkerLostError, match="generation 1"):
        s.run_gather(
            chunk=handle, generation=gen, indices=np.array([0]), n_frames=6, dtype=np.uint16
        )
    assert s.generation == 2 and s.pid != pid
    assert s.release([handle], generation=gen) == []  # stale: nothing to free
    assert s.stats()["handles"] == 0


def test_process_that_exits_or_never_answers(pipes: Start) -> None:
    s = ExternalSession(
        lambda: pipes(
            argv=[sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(7)"]
        ),
        name="dies",
        hello_timeout=20,
    )
    with pytest.raises(ExternalWorkerLostError) as info:
        s.start()
    assert info.value.exit_code == 7 and "boom" in info.value.stderr_tail
    s = ExternalSession(
        lambda: pipes(argv=[sys.executable, "-c", "import time; time.sleep(60)"]),
        name="silent",
        hello_timeout=1.0,
    )
    with pytest.raises(ExternalWorkerTimeoutError) as tinfo:
        s.start()
    assert tinfo.value.worker == "ref-test" and "within 1.0 s" in str(tinfo.value)
    assert not s.connected


def test_worker_writing_garbage_is_a_protocol_error(pipes: Start) -> None:
    conn = pipes(
        argv=[
            sys.executable,
            "-c",
            "import sys,time; sys.stdout.write('hello, world'); sys.stdout.flush(); time.sleep(60)",
        ]
    )
    with pytest.raises(ProtocolError) as info:
        conn.recv(20, message_type="hello")
    assert info.value.code == "frame" and info.value.worker == "ref-test"
    assert not conn.alive  # stopped


def test_missing_program() -> None:
    with pytest.raises(RuntimeUnavailableError, match="cannot start"):
        PipeConnection(["/nonexistent/qf-worker"], name="nope")


def test_reference_worker_state_machine() -> None:
    w = ReferenceWorker(budget_bytes=100)
    r = w.handle(pr.ping(id=1))
    assert r.header["code"] == "bad_request" and "hello first" in r.header["message"]
    assert w.handle(pr.hello_request(id=0, client="t")).type == "hello"
    r = w.handle(pr.put(id=2, handle=1, representation="dense", payload=BLOCK, scan_slice=SL))
    assert r.header["code"] == "budget" and r.header["handle"] == 1
    assert w.total_bytes() == 0
    small = np.ones((1, 1, 2, 2), dtype=np.float32)
    ok = w.handle(
        pr.put(id=3, handle=1, representation="dense", payload=small, scan_slice=((0, 1), (0, 1)))
    )
    assert ok.header["resident_bytes"] == 16
    w.handle(pr.put_weights(id=4, handle=2, weights=np.array([[0.5, 1, 0, 0]])))
    r = w.handle(pr.run_gather(id=5, chunk=1, indices=np.array([4])))
    assert r.header["code"] == "bad_request"
    r = w.handle(pr.run_frame_pass(id=6, chunk=1, weights=2, want_sum=True, want_max=True))
    out = pr.parse_frame_pass_result(
        r, n_frames=1, n_weights=1, n_pixels=4, dtype=np.float32, want_sum=True, want_max=True
    )
    assert out.per_frame[0, 0] == 1.5 and out.pattern_sum.dtype == np.float64
    assert r.header["accumulation"] == "float64"
    r = w.handle(pr.bye(id=7))
    assert r.type == "bye" and w.closing and w.total_bytes() == 0


_NESTED_WORKER = """
import struct, sys, time
h = b'{"type":"hello","id":0,"x":' + b'[' * 100000 + b']' * 100000 + b'}'
pad = (-(16 + len(h))) % 8
sys.stdout.buffer.write(b'QFW1' + struct.pack('<IQ', len(h), 0) + h + bytes(pad))
sys.stdout.flush()
time.sleep(60)
"""


def test_a_deeply_nested_header_from_the_worker_fails_the_request_at_once(pipes: Start) -> None:
    conn = pipes(argv=[sys.executable, "-c", _NESTED_WORKER])
    t0 = time.monotonic()
    with pytest.raises(ProtocolError) as info:
        conn.recv(60, message_type="hello")
    assert time.monotonic() - t0 < 10  # not the 60 s timeout
    assert info.value.code == "frame" and "deep" in str(info.value)
    assert not conn.alive  # stopped


def test_any_failure_of_the_reader_thread_reaches_the_request_at_once(
    pipes: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(self: object, data: bytes) -> list[object]:
        raise MemoryError("a decoder that cannot allocate")

    monkeypatch.setattr(pr.FrameDecoder, "feed", explode)
    conn = pipes()
    t0 = time.monotonic()
    with pytest.raises(ProtocolError) as info:
        conn.send(pr.hello_request(client="t"))
        conn.recv(60, message_type="hello")
    assert time.monotonic() - t0 < 30
    assert info.value.code == "frame" and "MemoryError" in str(info.value)


_WRONG_REPLY_WORKER = """
import os, sys
from quantem_flow.runtimes.external import protocol as pr
from quantem_flow.runtimes.external.reference_worker import ReferenceWorker
worker = ReferenceWorker()
dec = pr.FrameDecoder()
while True:
    data = os.read(0, 1 << 16)
    if not data:
        break
    for m in dec.feed(data):
        reply = worker.handle(m)
        if m.type == "ping":  # answers a ping with a stats reply of the same id
            reply = pr.stats_reply(id=m.id, handles=0, resident_bytes={}, memory_budget_bytes=1)
        sys.stdout.buffer.write(pr.encode(reply))
        sys.stdout.buffer.flush()
"""


def test_a_reply_of_the_wrong_type_is_refused(pipes: Start) -> None:
    s = ExternalSession(
        lambda: pipes(argv=[sys.executable, "-c", _WRONG_REPLY_WORKER]),
        name="ref-test",
        timeout=20,
        hello_timeout=60,
    )
    try:
        s.start()
        with pytest.raises(ProtocolError) as info:
            s.ping()
        assert info.value.code == "bad_request" and "'stats' reply, expected 'ping'" in str(
            info.value
        )
        assert not s.connected  # stopped; the next request restarts it
    finally:
        s.close()
