"""The committed golden vectors: every implementation parses and emits them identically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantem_flow.errors import ProtocolError
from quantem_flow.runtimes.external import protocol as pr
from quantem_flow.runtimes.external.vectors import build_vectors, index_bytes

ROOT = Path(__file__).resolve().parents[2] / "docs" / "protocol" / "vectors"
INDEX: dict[str, Any] = json.loads((ROOT / "index.json").read_text())
VECTORS = INDEX["vectors"]
VALID = [v for v in VECTORS if "header" in v]
INVALID = [v for v in VECTORS if "error" in v]

REQUIRED = {
    "hello_request",
    "hello_reply",
    "put_dense_u16",
    "put_paired",
    "put_packed",
    "put_weights",
    "run_frame_pass",
    "run_gather",
    "result_frame_pass",
    "release",
    "stats",
    "ping",
    "bye",
    "error_unknown_handle",
    "header_escapes",
    "put_weights_empty",
    "bad_magic",
    "body_length_too_long",
    "nonzero_buffer_padding",
    "float_in_header",
    "truncated_body",
    "header_not_object",
}


def test_index_covers_the_spec() -> None:
    assert INDEX["protocol"] == pr.PROTOCOL
    assert {v["name"] for v in VECTORS} >= REQUIRED
    assert len(VALID) >= 20 and len(INVALID) >= 15
    assert len(next(v for v in VALID if v["name"] == "result_frame_pass")["buffers_hex"]) == 3
    assert next(v for v in VALID if v["name"] == "put_weights_empty")["buffers_hex"] == [""]


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_parse_valid(vector: dict[str, Any]) -> None:
    data = (ROOT / vector["file"]).read_bytes()
    msg = pr.decode(data)
    assert msg.header == vector["header"]
    assert [bytes(b).hex() for b in msg.buffers] == vector["buffers_hex"]
    # and byte by byte through the stream decoder
    dec = pr.FrameDecoder()
    got = [m for i in range(len(data)) for m in dec.feed(data[i : i + 1])]
    dec.close()
    assert len(got) == 1 and got[0].header == vector["header"]


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_emit_valid(vector: dict[str, Any]) -> None:
    msg = pr.Message(vector["header"], [bytes.fromhex(h) for h in vector["buffers_hex"]])
    assert pr.encode(msg) == (ROOT / vector["file"]).read_bytes()


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_parse_invalid(vector: dict[str, Any]) -> None:
    data = (ROOT / vector["file"]).read_bytes()
    with pytest.raises(ProtocolError) as info:
        pr.decode(data)
    assert info.value.code == vector["error"]
    dec = pr.FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        for i in range(len(data)):
            dec.feed(data[i : i + 1])
        dec.close()
    assert info.value.code == vector["error"]


def test_generator_reproduces_committed_files() -> None:
    index, files = build_vectors()
    assert index_bytes(index) == (ROOT / "index.json").read_bytes()
    for name, data in files.items():
        assert (ROOT / name).read_bytes() == data, name
    committed = {p.name for p in ROOT.glob("*.bin")}
    assert committed == set(files)
