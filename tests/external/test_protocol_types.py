"""Typed requests and replies (protocol/requests.py) are the golden vectors' bytes exactly.

Every valid request vector parses into its dataclass, and that value's
``message()`` encodes to the vector's bytes; every reply vector parses against
the request it answers; a malformed request is refused with the protocol's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantem_flow.errors import ProtocolError
from quantem_flow.runtimes.external import protocol as pr

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "protocol" / "vectors"
INDEX = json.loads((VECTORS / "index.json").read_text(encoding="utf-8"))
BY_NAME = {v["name"]: v for v in INDEX["vectors"]}
REQUESTS = {
    "hello_request": pr.Hello,
    "put_dense_u16": pr.Put,
    "put_paired": pr.Put,
    "put_packed": pr.Put,
    "put_weights": pr.PutWeights,
    "put_weights_empty": pr.PutWeights,
    "run_frame_pass": pr.RunFramePass,
    "run_gather": pr.RunGather,
    "release": pr.Release,
    "stats": pr.Stats,
    "ping": pr.Ping,
    "bye": pr.Bye,
}


def _message(name: str) -> tuple[pr.Message, bytes]:
    raw = (VECTORS / BY_NAME[name]["file"]).read_bytes()
    return pr.decode(raw), raw


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_every_request_vector_round_trips(name: str) -> None:
    message, raw = _message(name)
    request = pr.parse_request(message)
    assert type(request) is REQUESTS[name]
    assert request.id == BY_NAME[name]["header"]["id"]
    assert pr.encode(request.message()) == raw


def test_typed_members() -> None:
    put = pr.parse_request(_message("put_dense_u16")[0])
    assert isinstance(put, pr.Put)
    assert (put.handle, put.representation, put.dtype, put.shape) == (
        3,
        "dense",
        "uint16",
        (1, 2, 3, 3),
    )
    assert put.scan_slice == ((4, 5), (0, 2))
    assert put.nbytes == 36 and isinstance(put.payload, np.ndarray)
    run = pr.parse_request(_message("run_frame_pass")[0])
    assert isinstance(run, pr.RunFramePass) and isinstance(run.want_sum, bool)
    gather = pr.parse_request(_message("run_gather")[0])
    assert isinstance(gather, pr.RunGather) and gather.indices.dtype == np.int64


REPLIES = {
    "hello_reply": ("hello_request", pr.HelloInfo, {}),
    "result_put": ("put_dense_u16", pr.PutResult, {}),
    "result_put_weights": ("put_weights", pr.PutWeightsResult, {}),
    "result_release": ("release", pr.ReleaseResult, {}),
    "stats_reply": ("stats", pr.StatsReply, {}),
    "ping": ("ping", pr.Ping, {}),
    "bye": ("bye", pr.Bye, {}),
    "error_unknown_handle": ("run_frame_pass", pr.ErrorReply, {}),
}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_every_reply_vector_parses_against_its_request(name: str) -> None:
    request_name, kind, expect = REPLIES[name]
    request = pr.parse_request(_message(request_name)[0])
    message, raw = _message(name)
    reply = pr.parse_reply(message, request, **expect)
    assert type(reply) is kind
    if hasattr(reply, "message") and kind is not pr.HelloInfo:
        assert pr.encode(reply.message()) == raw


def test_run_replies_parse_with_what_the_bridge_knows() -> None:
    run = pr.parse_request(_message("run_frame_pass")[0])
    message, _ = _message("result_frame_pass")
    header = BY_NAME["result_frame_pass"]["header"]
    per_frame = next(o for o in header["outputs"] if o["name"] == "per_frame")
    n_frames, n_weights = per_frame["shape"]
    reply = pr.parse_reply(
        message,
        run,
        n_frames=n_frames,
        n_weights=n_weights,
        n_pixels=9,
        dtype="uint16",
    )
    assert isinstance(reply, pr.FramePassOutputs) and reply.per_frame.shape == (n_frames, n_weights)
    gather = pr.parse_request(_message("run_gather")[0])
    message, raw = _message("result_gather")
    values = next(o for o in BY_NAME["result_gather"]["header"]["outputs"] if o["name"] == "values")
    got = pr.parse_reply(message, gather, n_frames=values["shape"][0], dtype=values["dtype"])
    assert isinstance(got, pr.GatherResult)
    assert pr.encode(got.message()) == raw


def test_malformed_requests_are_refused_with_the_protocol_codes() -> None:
    bad = pr.Message({"type": "run", "id": 1, "operation": "fft", "chunk": 2})
    with pytest.raises(ProtocolError) as info:
        pr.parse_request(bad)
    assert info.value.code == "unsupported"
    with pytest.raises(ProtocolError) as info:
        pr.parse_request(pr.Message({"type": "release", "id": 1, "handles": "all"}))
    assert info.value.code == "bad_request"
    with pytest.raises(ProtocolError, match="the reply to ping is 'bye'"):
        pr.parse_reply(_message("bye")[0], pr.Ping(5))
