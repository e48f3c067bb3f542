// The Node host over real pipes: errors instead of crashes, budget, stats, EOF = bye.
import { test } from "node:test";
import assert from "node:assert/strict";
import { PipeWorker, bytesOf } from "./helpers.js";
import { encodeFrame } from "../src/protocol.js";

test("requests and every error code the worker can send over pipes", async () => {
  const w = new PipeWorker(["--budget-bytes", "1000"]);
  const hello = await w.request({ type: "hello", protocol: "qf-worker/1", client: "test" });
  assert.equal(hello.header.runtime, "webgpu");
  assert.equal(hello.header.memory_budget_bytes, 1000);
  assert.deepEqual(hello.header.accumulation, { integer: "u32x2", real: "float32" });
  const kernels = hello.header.kernels as string[][];
  assert.ok(kernels.some((k) => k.join() === "frame_pass,packed,uint16"));
  const limits = hello.header.limits as Record<string, number>;
  assert.ok(
    limits.max_message_bytes > 0 && limits.max_buffer_bytes > 0 && limits.max_frame_pixels > 0,
  );
  const dense = (handle: number, n: number) =>
    w.request(
      {
        type: "put",
        handle,
        representation: "dense",
        storage_schema: "dense-v1",
        dtype: "uint8",
        shape: [1, n, 4, 4],
      },
      [new Uint8Array(16 * n).fill(3)],
    );
  assert.equal((await dense(1, 40)).header.resident_bytes, 640);
  const over = await dense(2, 30); // 480 > 360 left
  assert.equal(over.header.code, "budget");
  assert.equal(over.header.handle, 2);
  assert.match(String(over.header.message), /360/);
  const stats = await w.request({ type: "stats" });
  assert.deepEqual(stats.header.resident_bytes, { dense: 640, paired: 0, packed: 0, weights: 0 });
  assert.equal(stats.header.handles, 1);
  const codes: [Record<string, unknown>, Uint8Array[], string][] = [
    [{ type: "nope" }, [], "unsupported"],
    [{ type: "run", operation: "frame_pass", chunk: 77 }, [], "unknown_handle"],
    [{ type: "run", operation: "fft", chunk: 1 }, [], "unsupported"],
    [
      { type: "put", handle: 1, storage_schema: "dense-v1", dtype: "uint8", shape: [1, 1, 4, 4] },
      [new Uint8Array(16)],
      "bad_request",
    ],
    [
      { type: "put", handle: 5, storage_schema: "dense-v1", dtype: "uint8", shape: [1, 2, 4, 4] },
      [new Uint8Array(16)],
      "bad_request",
    ],
    [
      { type: "put", handle: 5, storage_schema: "zarr-v9", dtype: "uint8", shape: [1, 1, 4, 4] },
      [],
      "unsupported",
    ],
    [
      { type: "put", handle: 5, storage_schema: "dense-v1", dtype: "float64", shape: [1, 1, 1, 1] },
      [new Uint8Array(8)],
      "unsupported",
    ],
    [
      { type: "put_weights", handle: 6, shape: [1, 16], dtype: "float64" },
      [new Uint8Array(8)],
      "bad_request",
    ],
    [{ type: "release", handles: "all" }, [], "bad_request"],
    [
      { type: "run", operation: "gather", chunk: 1 },
      [bytesOf(new BigInt64Array([16n]))],
      "bad_request",
    ],
  ];
  for (const [h, b, code] of codes) {
    const r = await w.request(h as never, b);
    assert.equal(r.header.type, "error", JSON.stringify(h));
    assert.equal(r.header.code, code, `${JSON.stringify(h)}: ${String(r.header.message)}`);
    assert.ok(String(r.header.message).length > 20);
  }
  const wrongVersion = await w.request({ type: "ping" });
  assert.equal(wrongVersion.header.type, "ping");
  const rel = await w.request({ type: "release", handles: [1, 1] });
  assert.deepEqual(rel.header.released, [1]);
  assert.equal(rel.header.resident_bytes, 0);
  // a frame the worker cannot parse: error with id null, then the worker closes
  w.sendRaw(new Uint8Array([0x58, 0x46, 0x57, 0x31, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]));
  const err = await w.next();
  assert.equal(err.header.code, "frame");
  assert.equal(err.header.id, null);
  assert.equal(await w.exit, 0);
});

test("wrong protocol version closes; EOF is bye; truncated stream reported", async () => {
  const w = new PipeWorker();
  const r = await w.request({ type: "hello", protocol: "qf-worker/9" });
  assert.equal(r.header.code, "version");
  assert.match(String(r.header.message), /qf-worker\/1/);
  assert.equal(await w.exit, 0);
  const w2 = new PipeWorker();
  assert.equal((await w2.request({ type: "ping" })).header.type, "ping");
  w2.sendRaw(encodeFrame({ type: "ping", id: 50 }).subarray(0, 12));
  w2.proc.stdin.end();
  const t = await w2.next();
  assert.equal(t.header.code, "truncated");
  assert.equal(await w2.exit, 0);
  const w3 = new PipeWorker();
  w3.proc.stdin.end();
  assert.equal(await w3.exit, 0);
});
