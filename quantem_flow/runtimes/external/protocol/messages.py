"""The messages of ``qf-worker/1``: building and checking each request and reply.

Each message is a :class:`~.framing.Message` (a canonical-JSON header and its
buffers); the builders here make them and the parsers check every member
before a value reaches a runtime (``docs/protocol.md``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ....errors import ProtocolError
from .framing import (
    _COUNT_DTYPES,
    _INDEX_DTYPES,
    _LITTLE,
    ACCUMULATIONS,
    DTYPES,
    ERROR_CODES,
    MAX_INT,
    PROTOCOL,
    REQUEST_TYPES,
    STORAGE_SCHEMAS,
    Message,
    _fail,
)

__all__ = [
    "FramePassOutputs",
    "HelloInfo",
    "bye",
    "error",
    "frame_pass_result",
    "gather_result",
    "hello_reply",
    "hello_request",
    "parse_frame_pass_result",
    "parse_gather_result",
    "parse_hello_reply",
    "parse_put",
    "parse_put_weights",
    "parse_run_gather",
    "ping",
    "put",
    "put_result",
    "put_weights",
    "put_weights_result",
    "release",
    "release_result",
    "run_frame_pass",
    "run_gather",
    "stats",
    "stats_reply",
    "validate_request",
]


# ---------------------------------------------------------------------------- helpers


def _bad(message: str, kind: str, *, handle: int | None = None) -> ProtocolError:
    return _fail(message, code="bad_request", message_type=kind, handle=handle)


def _int(header: dict[str, Any], key: str, kind: str, *, minimum: int = 0) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise _bad(f"{kind}: member {key!r} must be an integer >= {minimum}, got {value!r}", kind)
    return value


def _str(header: dict[str, Any], key: str, kind: str, choices: Sequence[str] | None = None) -> str:
    value = header.get(key)
    if not isinstance(value, str) or (choices is not None and value not in choices):
        expect = f"one of {list(choices)}" if choices is not None else "a string"
        raise _bad(f"{kind}: member {key!r} must be {expect}, got {value!r}", kind)
    return str(value)


def _ints(header: dict[str, Any], key: str, kind: str, *, length: int | None = None) -> list[int]:
    value = header.get(key)
    if (
        not isinstance(value, list)
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
        or (length is not None and len(value) != length)
    ):
        n = f"{length} " if length is not None else ""
        raise _bad(
            f"{kind}: member {key!r} must be a list of {n}non-negative integers, got {value!r}",
            kind,
        )
    return [int(v) for v in value]


def _bool(header: dict[str, Any], key: str, kind: str) -> bool:
    value = header.get(key)
    if not isinstance(value, bool):
        raise _bad(f"{kind}: member {key!r} must be true or false, got {value!r}", kind)
    return value


def _nbuf(message: Message, n: int) -> list[memoryview]:
    views = message.buffer_views()
    if len(views) != n:
        raise _bad(
            f"{message.type}: expected {n} buffer(s), got {len(views)}",
            message.type,
            handle=_handle_of(message),
        )
    return views


def _handle_of(message: Message) -> int | None:
    for key in ("handle", "chunk"):
        value = message.header.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _array(view: memoryview, dtype: str, shape: Sequence[int], what: str, kind: str) -> np.ndarray:
    dt = np.dtype(dtype).newbyteorder("<")
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if view.nbytes != count * dt.itemsize:
        raise _bad(
            f"{kind}: buffer {what} has {view.nbytes} bytes, expected {count} {dtype} values "
            f"= {count * dt.itemsize} bytes for shape {list(shape)}",
            kind,
        )
    arr = np.frombuffer(view, dtype=dt) if view.nbytes else np.zeros(0, dtype=dt)
    if not _LITTLE:  # pragma: no cover - big-endian hosts
        arr = arr.astype(dt.newbyteorder("="))
    return arr.reshape(tuple(shape))


def _dtype_name(dtype: Any, what: str) -> str:
    name = str(np.dtype(dtype).name)
    if name not in DTYPES:
        raise _bad(f"{what}: dtype {name} is not one of {list(DTYPES)}", "put")
    return name


def _req(kind: str, id: int, **members: Any) -> dict[str, Any]:
    if not isinstance(id, int) or isinstance(id, bool) or not 0 <= id <= MAX_INT:
        raise _bad(f"{kind}: id must be an integer in [0, 2**53 - 1], got {id!r}", kind)
    return {"type": kind, "id": id, **members}


# ---------------------------------------------------------------------------- hello


def hello_request(*, id: int = 0, client: str, protocol: str = PROTOCOL) -> Message:
    """Return the bridge's ``hello`` (the first message on every connection)."""
    return Message(_req("hello", id, protocol=protocol, client=client))


@dataclasses.dataclass(frozen=True)
class HelloInfo:
    """What a worker says about itself in its ``hello`` reply.

    Attributes
    ----------
    runtime
        The runtime name the worker implements (``"webgpu"``...).
    implementation
        Name, version and host of the worker program.
    device
        Device description (strings and integers).
    limits
        ``max_message_bytes``, ``max_buffer_bytes``, ``max_weights``,
        ``max_frame_pixels``.
    memory_budget_bytes
        Payload bytes the worker admits in total.
    kernels
        ``(operation, representation, dtype)`` triples.
    storage_schemas
        Storage schemas accepted by ``put``.
    accumulation
        ``{"integer": ..., "real": ...}``.
    """

    runtime: str
    implementation: str
    device: dict[str, Any]
    limits: dict[str, int]
    memory_budget_bytes: int
    kernels: tuple[tuple[str, str, str], ...]
    storage_schemas: tuple[str, ...]
    accumulation: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (provenance)."""
        out = dataclasses.asdict(self)
        out["kernels"] = [list(k) for k in self.kernels]
        out["storage_schemas"] = list(self.storage_schemas)
        return out


_LIMITS = ("max_message_bytes", "max_buffer_bytes", "max_weights", "max_frame_pixels")


def hello_reply(
    *,
    id: int,
    runtime: str,
    implementation: str,
    device: dict[str, Any],
    limits: dict[str, int],
    memory_budget_bytes: int,
    kernels: Iterable[Sequence[str]],
    storage_schemas: Iterable[str],
    accumulation: dict[str, str],
) -> Message:
    """Return a worker's ``hello`` reply (see :class:`HelloInfo` for the members)."""
    msg = Message(
        _req(
            "hello",
            id,
            protocol=PROTOCOL,
            runtime=runtime,
            implementation=implementation,
            device=dict(device),
            limits=dict(limits),
            memory_budget_bytes=int(memory_budget_bytes),
            kernels=[list(k) for k in kernels],
            storage_schemas=list(storage_schemas),
            accumulation=dict(accumulation),
        )
    )
    parse_hello_reply(msg)
    return msg


def parse_hello_reply(message: Message) -> HelloInfo:
    """Validate a ``hello`` reply and return its contents.

    Raises
    ------
    ProtocolError
        ``version`` if the worker speaks another protocol, ``bad_request``
        for a missing or ill-typed member.
    """
    h = message.header
    kind = "hello"
    if message.type != "hello":
        raise _bad(f"expected a hello reply, got {message.type!r}", kind)
    if h.get("protocol") != PROTOCOL:
        raise _fail(
            f"the worker speaks {h.get('protocol')!r}, this bridge speaks {PROTOCOL!r}; "
            "update one side",
            code="version",
            message_type=kind,
        )
    device = h.get("device")
    if not isinstance(device, dict):
        raise _bad(f"hello: member 'device' must be an object, got {device!r}", kind)
    limits = h.get("limits")
    if not isinstance(limits, dict):
        raise _bad(f"hello: member 'limits' must be an object, got {limits!r}", kind)
    lim = {k: _int(limits, k, "hello.limits") for k in _LIMITS}
    kernels = h.get("kernels")
    if not isinstance(kernels, list) or not all(
        isinstance(k, list) and len(k) == 3 and all(isinstance(s, str) for s in k) for k in kernels
    ):
        raise _bad(
            f"hello: member 'kernels' must be a list of [operation, representation, dtype], "
            f"got {kernels!r}",
            kind,
        )
    schemas = h.get("storage_schemas")
    if not isinstance(schemas, list) or not all(isinstance(s, str) for s in schemas):
        raise _bad(
            f"hello: member 'storage_schemas' must be a list of strings, got {schemas!r}", kind
        )
    acc = h.get("accumulation")
    if (
        not isinstance(acc, dict)
        or acc.get("integer") not in ACCUMULATIONS
        or acc.get("real") not in ACCUMULATIONS
    ):
        raise _bad(
            f"hello: member 'accumulation' must be {{'integer': ..., 'real': ...}} with values in "
            f"{list(ACCUMULATIONS)}, got {acc!r}",
            kind,
        )
    return HelloInfo(
        runtime=_str(h, "runtime", kind),
        implementation=_str(h, "implementation", kind),
        device=dict(device),
        limits=lim,
        memory_budget_bytes=_int(h, "memory_budget_bytes", kind),
        kernels=tuple((str(a), str(b), str(c)) for a, b, c in kernels),
        storage_schemas=tuple(schemas),
        accumulation={"integer": str(acc["integer"]), "real": str(acc["real"])},
    )


# ---------------------------------------------------------------------------- put


def _scan_slice_member(scan_slice: Any) -> list[list[int]]:
    (r0, r1), (c0, c1) = scan_slice
    return [[int(r0), int(r1)], [int(c0), int(c1)]]


def put(
    *,
    id: int,
    handle: int,
    representation: str,
    payload: Any,
    scan_slice: Any,
) -> Message:
    """Return a ``put`` request carrying one chunk's payload, without copying it.

    Parameters
    ----------
    id, handle
        Request id and the new handle.
    representation
        ``"dense"`` (an array ``(rows, cols, k_r, k_c)``), ``"paired"`` (a
        :class:`~quantem_flow.representations.paired.PairedPayload`) or
        ``"packed"`` (a :class:`~quantem_flow.representations.packed.PackedPayload`).
    payload
        The payload object.
    scan_slice
        ``((r0, r1), (c0, c1))`` of the chunk.

    Raises
    ------
    ProtocolError
        ``unsupported`` for a representation or dtype without a storage
        schema here (encoded, uint64 counts), ``bad_request`` for an
        inconsistent payload.
    """
    kind = "put"
    common = {"handle": handle, "representation": representation, "scan_slice": None}
    common["scan_slice"] = _scan_slice_member(scan_slice)
    if representation == "dense":
        arr = np.asarray(payload)
        if arr.ndim != 4:
            raise _bad(
                f"put: a dense payload is (rows, cols, k_r, k_c), got shape {arr.shape}", kind
            )
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["dense"],
            dtype=_dtype_name(arr.dtype, "put dense"),
            shape=[int(s) for s in arr.shape],
        )
        return Message(header, [arr])
    if representation == "paired":
        p = payload
        if p.pending_threshold is not None:
            raise _bad("put: a paired payload with a pending threshold cannot be stored", kind)
        count_dtype = np.dtype(p.counts.dtype).name
        if count_dtype not in _COUNT_DTYPES:
            raise _fail(
                f"put: paired counts of dtype {count_dtype} have no qf-worker/1 layout (counts "
                f"are one of {list(_COUNT_DTYPES)}); keep this chunk on a host runtime",
                code="unsupported",
                message_type=kind,
                handle=handle,
            )
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["paired"],
            dtype=_dtype_name(p.value_dtype, "put paired"),
            shape=[*p.scan_shape, *p.frame_shape],
            index_dtype=np.dtype(p.indices.dtype).name,
            count_dtype=count_dtype,
        )
        return Message(header, [p.indptr, p.indices, p.counts])
    if representation == "packed":
        p = payload
        header = _req(
            kind,
            id,
            **common,
            storage_schema=STORAGE_SCHEMAS["packed"],
            dtype=_dtype_name(p.value_dtype, "put packed"),
            shape=[*p.scan_shape, *p.frame_shape],
            block_values=int(p.block_values),
        )
        return Message(header, [p.widths, p.offsets, p.data])
    raise _fail(
        f"put: the {representation!r} representation has no qf-worker/1 storage schema "
        f"(schemas: {STORAGE_SCHEMAS}); convert it or keep it on a host runtime",
        code="unsupported",
        message_type=kind,
        handle=handle,
    )


def _validate_put_header(h: dict[str, Any]) -> tuple[str, str, list[int], list[list[int]]]:
    kind = "put"
    handle = h.get("handle") if isinstance(h.get("handle"), int) else None
    _int(h, "handle", kind)
    rep = h.get("representation")
    schema = h.get("storage_schema")
    if rep not in STORAGE_SCHEMAS or schema != STORAGE_SCHEMAS[str(rep)]:
        raise _fail(
            f"put: representation {rep!r} with storage_schema {schema!r} is not offered; "
            f"offered: {STORAGE_SCHEMAS}",
            code="unsupported",
            message_type=kind,
            handle=handle,
        )
    dtype = _str(h, "dtype", kind, DTYPES)
    shape = _ints(h, "shape", kind, length=4)
    sl = h.get("scan_slice")
    if (
        not isinstance(sl, list)
        or len(sl) != 2
        or not all(
            isinstance(p, list)
            and len(p) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in p)
            and p[0] <= p[1]
            for p in sl
        )
    ):
        raise _bad(f"put: scan_slice must be [[r0, r1], [c0, c1]] with r0 <= r1, got {sl!r}", kind)
    if [sl[0][1] - sl[0][0], sl[1][1] - sl[1][0]] != shape[:2]:
        raise _bad(
            f"put: scan_slice {sl} covers {sl[0][1] - sl[0][0]} x {sl[1][1] - sl[1][0]} scan "
            f"positions but shape is {shape}",
            kind,
            handle=handle,
        )
    return str(rep), dtype, shape, sl


def parse_put(message: Message) -> tuple[str, Any, tuple[tuple[int, int], tuple[int, int]]]:
    """Validate a ``put`` request and rebuild its payload (views into the frame).

    Returns
    -------
    tuple
        ``(representation, payload, scan_slice)``; the payload is a dense
        array, a ``PairedPayload`` or a ``PackedPayload``.

    Raises
    ------
    ProtocolError
        ``bad_request`` for wrong members or buffer sizes, ``unsupported``
        for a schema not offered.
    """
    h = message.header
    rep, dtype, shape, sl = _validate_put_header(h)
    scan_slice = ((sl[0][0], sl[0][1]), (sl[1][0], sl[1][1]))
    handle = int(h["handle"])
    kind = "put"
    rows, cols, kr, kc = shape
    n, k = rows * cols, kr * kc
    try:
        if rep == "dense":
            (frames,) = _nbuf(message, 1)
            return rep, _array(frames, dtype, shape, "frames", kind), scan_slice
        if rep == "paired":
            from ....representations.paired import PairedPayload

            index_dtype = _str(h, "index_dtype", kind, _INDEX_DTYPES)
            count_dtype = _str(h, "count_dtype", kind, _COUNT_DTYPES)
            if np.dtype(dtype).kind not in "ui":
                raise _bad(f"put: paired data must have an integer dtype, got {dtype}", kind)
            b_indptr, b_indices, b_counts = _nbuf(message, 3)
            indptr = _array(b_indptr, "int64", [n + 1], "indptr", kind)
            m = b_indices.nbytes // np.dtype(index_dtype).itemsize
            indices = _array(b_indices, index_dtype, [m], "indices", kind)
            counts = _array(b_counts, count_dtype, [m], "counts", kind)
            if m and int(indices.max()) >= k:
                raise _bad(f"put: a paired index is {int(indices.max())} >= {k} pixels", kind)
            if np.any(np.diff(indptr) < 0):
                raise _bad("put: paired indptr must be non-decreasing", kind)
            paired = PairedPayload(
                scan_shape=(rows, cols),
                frame_shape=(kr, kc),
                indptr=indptr,
                indices=indices,
                counts=counts,
                value_dtype=np.dtype(dtype),
            )
            return rep, paired, scan_slice
        from ....representations.packed import PackedPayload

        bv = _int(h, "block_values", kind, minimum=32)
        if bv % 32:
            raise _bad(f"put: block_values must be a multiple of 32, got {bv}", kind)
        if np.dtype(dtype).kind not in "ui":
            raise _bad(f"put: packed data must have an integer dtype, got {dtype}", kind)
        b_widths, b_offsets, b_data = _nbuf(message, 3)
        nb = n * (-(-k // bv))
        widths = _array(b_widths, "uint8", [nb], "widths", kind)
        offsets = _array(b_offsets, "int64", [nb], "offsets", kind)
        if b_data.nbytes % 4 or b_data.nbytes < 4:
            raise _bad(
                f"put: packed data must be whole uint32 words plus a trailing zero word, got "
                f"{b_data.nbytes} bytes",
                kind,
            )
        data = _array(b_data, "uint32", [b_data.nbytes // 4], "data", kind)
        payload = PackedPayload(
            scan_shape=(rows, cols),
            frame_shape=(kr, kc),
            value_dtype=np.dtype(dtype),
            block_values=bv,
            widths=widths,
            offsets=offsets,
            data=data,
        )
        return rep, payload, scan_slice
    except ProtocolError as exc:
        exc.handle = handle
        raise
    except ValueError as exc:  # ShapeError from the payload classes
        raise _bad(f"put: inconsistent {rep} payload: {exc}", kind, handle=handle) from exc


def put_result(*, id: int, handle: int, resident_bytes: int) -> Message:
    """Return the reply to ``put``."""
    return Message(_req("result", id, handle=handle, resident_bytes=int(resident_bytes)))


# ---------------------------------------------------------------------------- weights


def put_weights(*, id: int, handle: int, weights: np.ndarray) -> Message:
    """Return a ``put_weights`` request for ``(m, K)`` float64 weight rows."""
    w = np.asarray(weights)
    if w.ndim != 2 or w.dtype != np.float64:
        raise _bad(
            f"put_weights: weights must be (m, K) float64, got {w.dtype} {w.shape}", "put_weights"
        )
    header = _req(
        "put_weights", id, handle=handle, shape=[int(s) for s in w.shape], dtype="float64"
    )
    return Message(header, [w])


def parse_put_weights(message: Message) -> np.ndarray:
    """Validate a ``put_weights`` request and return the ``(m, K)`` float64 rows."""
    h = message.header
    kind = "put_weights"
    _int(h, "handle", kind)
    _str(h, "dtype", kind, ("float64",))
    shape = _ints(h, "shape", kind, length=2)
    (buf,) = _nbuf(message, 1)
    return _array(buf, "float64", shape, "weights", kind)


def put_weights_result(
    *, id: int, handle: int, resident_bytes: int, integer_weights: bool
) -> Message:
    """Return the reply to ``put_weights``."""
    return Message(
        _req(
            "result",
            id,
            handle=handle,
            resident_bytes=int(resident_bytes),
            integer_weights=bool(integer_weights),
        )
    )


# ---------------------------------------------------------------------------- run


def run_frame_pass(*, id: int, chunk: int, weights: int, want_sum: bool, want_max: bool) -> Message:
    """Return a ``run`` request of the fused frame pass."""
    return Message(
        _req(
            "run",
            id,
            operation="frame_pass",
            chunk=chunk,
            weights=weights,
            options={"want_sum": bool(want_sum), "want_max": bool(want_max)},
        )
    )


def run_gather(*, id: int, chunk: int, indices: np.ndarray) -> Message:
    """Return a ``run`` request gathering flat detector pixels ``indices``."""
    idx = np.ascontiguousarray(indices, dtype=np.int64)
    return Message(_req("run", id, operation="gather", chunk=chunk), [idx.reshape(-1)])


def parse_run_gather(message: Message) -> np.ndarray:
    """Return the int64 indices of a ``run`` gather request."""
    (buf,) = _nbuf(message, 1)
    if buf.nbytes % 8:
        raise _bad(f"run gather: indices buffer of {buf.nbytes} bytes is not int64", "run")
    idx = _array(buf, "int64", [buf.nbytes // 8], "indices", "run")
    if idx.size and int(idx.min()) < 0:
        raise _bad("run gather: indices must be non-negative", "run")
    return idx


def _pattern_sum_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """int64 for integer data (uint64 for uint64 data), float64 for real data."""
    if dtype.kind in "uib":
        return np.dtype(np.uint64 if dtype == np.uint64 else np.int64)
    return np.dtype(np.float64)


def _output(name: str, arr: np.ndarray) -> dict[str, Any]:
    return {"name": name, "dtype": np.dtype(arr.dtype).name, "shape": [int(s) for s in arr.shape]}


def frame_pass_result(
    *,
    id: int,
    per_frame: np.ndarray,
    pattern_sum: np.ndarray | None,
    pattern_max: np.ndarray | None,
    accumulation: str,
) -> Message:
    """Return the reply to a frame-pass ``run`` (one buffer per output)."""
    arrays = [("per_frame", per_frame)]
    if pattern_sum is not None:
        arrays.append(("pattern_sum", pattern_sum))
    if pattern_max is not None:
        arrays.append(("pattern_max", pattern_max))
    return Message(
        _req(
            "result",
            id,
            outputs=[_output(n, a) for n, a in arrays],
            accumulation=accumulation,
        ),
        [np.ascontiguousarray(a) for _, a in arrays],
    )


def gather_result(*, id: int, values: np.ndarray) -> Message:
    """Return the reply to a gather ``run``."""
    return Message(_req("result", id, outputs=[_output("values", values)]), [values])


def _outputs(message: Message, kind: str) -> dict[str, np.ndarray]:
    outs = message.header.get("outputs")
    if not isinstance(outs, list) or not all(isinstance(o, dict) for o in outs):
        raise _bad(f"{kind} result: 'outputs' must be a list of objects, got {outs!r}", kind)
    views = _nbuf(message, len(outs))
    arrays: dict[str, np.ndarray] = {}
    for out, view in zip(outs, views, strict=True):
        name = _str(out, "name", kind)
        arrays[name] = _array(
            view, _str(out, "dtype", kind, DTYPES), _ints(out, "shape", kind), name, kind
        )
    return arrays


@dataclasses.dataclass
class FramePassOutputs:
    """A frame-pass reply: the arrays of a ``FramePassResult`` plus the accumulation used."""

    per_frame: np.ndarray
    pattern_sum: np.ndarray | None
    pattern_max: np.ndarray | None
    accumulation: str


def parse_frame_pass_result(
    message: Message,
    *,
    n_frames: int,
    n_weights: int,
    n_pixels: int,
    dtype: Any,
    want_sum: bool,
    want_max: bool,
) -> FramePassOutputs:
    """Validate a frame-pass reply against what was asked and return its arrays.

    Raises
    ------
    ProtocolError
        ``bad_request`` when an output is missing, extra, or of the wrong
        dtype or shape.
    """
    kind = "run"
    arrays = _outputs(message, kind)
    expect: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {
        "per_frame": (np.dtype(np.float64), (n_frames, n_weights))
    }
    data_dtype = np.dtype(dtype)
    if want_sum:
        sum_dt = _pattern_sum_dtype(data_dtype)
        expect["pattern_sum"] = (sum_dt, (n_pixels,))
    if want_max:
        expect["pattern_max"] = (data_dtype, (n_pixels,))
    if set(arrays) != set(expect):
        raise _bad(
            f"frame_pass result: outputs {sorted(arrays)} but {sorted(expect)} were asked for",
            kind,
        )
    for name, (dt, shape) in expect.items():
        got = arrays[name]
        if got.dtype != dt or got.shape != shape:
            raise _bad(
                f"frame_pass result: {name} is {got.dtype} {got.shape}, expected {dt} {shape}",
                kind,
            )
    acc = _str(message.header, "accumulation", kind, ACCUMULATIONS)
    return FramePassOutputs(
        per_frame=arrays["per_frame"],
        pattern_sum=arrays.get("pattern_sum"),
        pattern_max=arrays.get("pattern_max"),
        accumulation=acc,
    )


def parse_gather_result(
    message: Message, *, n_frames: int, n_indices: int, dtype: Any
) -> np.ndarray:
    """Validate a gather reply and return ``values (n_frames, n_indices)``."""
    arrays = _outputs(message, "run")
    values = arrays.get("values")
    dt = np.dtype(dtype)
    if (
        set(arrays) != {"values"}
        or values is None
        or values.dtype != dt
        or values.shape
        != (
            n_frames,
            n_indices,
        )
    ):
        raise _bad(
            f"gather result: expected one output 'values' {dt} {(n_frames, n_indices)}, got "
            f"{[(k, str(v.dtype), v.shape) for k, v in arrays.items()]}",
            "run",
        )
    return values


# ---------------------------------------------------------------------------- the rest


def release(*, id: int, handles: Iterable[int]) -> Message:
    """Return a ``release`` request."""
    return Message(_req("release", id, handles=[int(h) for h in handles]))


def release_result(*, id: int, released: Iterable[int], resident_bytes: int) -> Message:
    """Return the reply to ``release``."""
    return Message(
        _req("result", id, released=[int(h) for h in released], resident_bytes=int(resident_bytes))
    )


def stats(*, id: int) -> Message:
    """Return a ``stats`` request."""
    return Message(_req("stats", id))


def stats_reply(
    *, id: int, handles: int, resident_bytes: dict[str, int], memory_budget_bytes: int
) -> Message:
    """Return the reply to ``stats``."""
    return Message(
        _req(
            "stats",
            id,
            handles=int(handles),
            resident_bytes={k: int(v) for k, v in resident_bytes.items()},
            memory_budget_bytes=int(memory_budget_bytes),
        )
    )


def ping(*, id: int) -> Message:
    """Return a ``ping`` (the reply is the same message)."""
    return Message(_req("ping", id))


def bye(*, id: int) -> Message:
    """Return a ``bye`` (the reply is the same message)."""
    return Message(_req("bye", id))


def error(*, id: int | None, code: str, message: str, handle: int | None = None) -> Message:
    """Return an ``error`` reply (``id=None`` for an unsolicited one before closing)."""
    if code not in ERROR_CODES:
        raise _bad(f"error: code {code!r} is not one of {list(ERROR_CODES)}", "error")
    header: dict[str, Any] = {"type": "error", "id": id, "code": code, "message": message}
    if handle is not None:
        header["handle"] = int(handle)
    return Message(header)


def validate_request(message: Message) -> None:
    """Check a request's members (the worker's first step on every message).

    Raises
    ------
    ProtocolError
        ``bad_request`` for a missing or ill-typed member (or a wrong buffer
        count), ``unsupported`` for an unknown message type or operation.
    """
    h = message.header
    kind = message.type
    if kind not in REQUEST_TYPES:
        raise _fail(
            f"message type {kind!r} is not a request this worker answers; requests: "
            f"{list(REQUEST_TYPES)}",
            code="unsupported",
            message_type=kind,
        )
    _int(h, "id", kind)
    if kind == "hello":
        _str(h, "protocol", kind)
    elif kind == "put":
        _validate_put_header(h)
    elif kind == "put_weights":
        _int(h, "handle", kind)
        _ints(h, "shape", kind, length=2)
        _str(h, "dtype", kind, ("float64",))
        _nbuf(message, 1)
    elif kind == "run":
        op = _str(h, "operation", kind)
        _int(h, "chunk", kind)
        if op == "frame_pass":
            _int(h, "weights", kind)
            options = h.get("options")
            if not isinstance(options, dict):
                raise _bad(f"run: member 'options' must be an object, got {options!r}", kind)
            _bool(options, "want_sum", kind)
            _bool(options, "want_max", kind)
            _nbuf(message, 0)
        elif op == "gather":
            _nbuf(message, 1)
        else:
            raise _fail(
                f"run: operation {op!r} is not offered; operations: ['frame_pass', 'gather']",
                code="unsupported",
                message_type=kind,
                handle=_handle_of(message),
            )
    elif kind == "release":
        _ints(h, "handles", kind)
