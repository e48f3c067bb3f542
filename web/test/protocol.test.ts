import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync, existsSync } from "node:fs";
import path from "node:path";
import {
  StreamDecoder,
  canonicalJson,
  decodeFrame,
  encodeFrame,
  fromHex,
  hex,
  ProtocolError,
  type Header,
} from "../src/protocol.js";
import { WEB } from "./helpers.js";

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    if (e instanceof ProtocolError) return e.code;
    throw e;
  }
  return "ok";
}

test("round trip with buffers of odd lengths, 8-byte aligned", () => {
  const bufs = [new Uint8Array([1, 2, 3]), new Uint8Array(0), new Uint8Array(9).fill(7)];
  const f = encodeFrame({ type: "put", id: 3, name: "é☃" }, bufs);
  assert.equal(f.byteLength % 8, 0);
  const m = decodeFrame(f);
  assert.deepEqual(m.header, { type: "put", id: 3, name: "é☃", buffers: [3, 0, 9] });
  assert.deepEqual(
    m.buffers.map((b) => hex(b)),
    bufs.map((b) => hex(b)),
  );
  assert.deepEqual(encodeFrame(m.header, m.buffers), f);
});

test("canonical JSON: sorted keys, no whitespace, lowercase \\u escapes, / unescaped", () => {
  assert.equal(
    canonicalJson({ b: 1, a: [true, null, "x/\u00e9\n\u0001\ud83d\ude00"] }),
    '{"a":[true,null,"x/\\u00e9\\n\\u0001\\ud83d\\ude00"],"b":1}',
  );
  assert.throws(() => canonicalJson({ a: 1.5 }));
  assert.throws(() => canonicalJson({ a: 2 ** 53 }));
});

function raw(header: string, body: Uint8Array = new Uint8Array(0), bodyLen?: bigint): Uint8Array {
  const h = new TextEncoder().encode(header);
  const start = Math.ceil((16 + h.length) / 8) * 8;
  const out = new Uint8Array(start + body.length);
  out.set([0x51, 0x46, 0x57, 0x31]);
  const dv = new DataView(out.buffer);
  dv.setUint32(4, h.length, true);
  dv.setBigUint64(8, bodyLen ?? BigInt(body.length), true);
  out.set(h, 16);
  out.set(body, start);
  return out;
}

test("every malformation gives its code", () => {
  const good = encodeFrame({ type: "ping", id: 1 }, [new Uint8Array([1])]);
  const badMagic = good.slice();
  badMagic[0] = 0x58;
  assert.equal(
    code(() => decodeFrame(badMagic)),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(good.subarray(0, good.length - 8))),
    "truncated",
  );
  assert.equal(
    code(() => decodeFrame(good.subarray(0, 10))),
    "truncated",
  );
  const padBad = good.slice();
  padBad[padBad.length - 1] = 1;
  assert.equal(
    code(() => decodeFrame(padBad)),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"ping","id":1.0}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"ping","id":1e3}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"ping","id":9007199254740992}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"id":1}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":3,"id":1}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw("[1]"))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"x",'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"x","buffers":[-1]}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"x","buffers":"a"}'))),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(raw('{"type":"x","buffers":[8]}', new Uint8Array(16)))),
    "frame",
  );
  const badUtf8 = raw('{"type":"xx"}');
  badUtf8[26] = 0xff;
  assert.equal(
    code(() => decodeFrame(badUtf8)),
    "frame",
  );
  const hugeHeader = good.slice();
  new DataView(hugeHeader.buffer).setUint32(4, 16 * 1024 * 1024 + 1, true);
  assert.equal(
    code(() => decodeFrame(hugeHeader)),
    "frame",
  );
  assert.equal(
    code(() => decodeFrame(good, 8)),
    "too_large",
  );
  assert.equal(
    code(() => decodeFrame(good)),
    "ok",
  );
});

test("stream decoder: byte-at-a-time, too_large skipped, frame error fatal, EOF truncated", () => {
  const a = encodeFrame({ type: "ping", id: 1 });
  const big = encodeFrame({ type: "put", id: 2, handle: 5 }, [new Uint8Array(100)]);
  const b = encodeFrame({ type: "stats", id: 3 }, [new Uint8Array([9, 8, 7])]);
  const all = new Uint8Array([...a, ...big, ...b]);
  const d = new StreamDecoder(64);
  const evs = [];
  for (const x of all) evs.push(...d.push(new Uint8Array([x])));
  assert.equal(evs.length, 3);
  assert.equal(evs[0].kind === "message" && evs[0].message.header.id, 1);
  assert.ok(evs[1].kind === "error" && evs[1].error.code === "too_large" && evs[1].id === 2);
  assert.ok(evs[2].kind === "message" && hex(evs[2].message.buffers[0]) === "090807");
  assert.equal(d.end(), null);
  const d2 = new StreamDecoder();
  assert.deepEqual(d2.push(a.subarray(0, 20)), []);
  const t = d2.end();
  assert.ok(t && t.kind === "error" && t.error.code === "truncated");
  const d3 = new StreamDecoder();
  const ev3 = d3.push(new Uint8Array([1, 2, 3, 4, 5]));
  assert.ok(ev3[0].kind === "error" && ev3[0].error.code === "frame" && ev3[0].fatal);
  assert.deepEqual(d3.push(a), []);
});

const vecDir = path.join(WEB, "../docs/protocol/vectors");
const have = existsSync(path.join(vecDir, "index.json"));
test(
  "golden vectors (docs/protocol/vectors): parse and emit",
  { skip: have ? false : "docs/protocol/vectors/index.json is not in this checkout" },
  () => {
    const index = JSON.parse(readFileSync(path.join(vecDir, "index.json"), "utf8")) as {
      vectors: {
        name: string;
        file: string;
        header?: Header;
        buffers_hex?: string[];
        error?: string;
      }[];
    };
    assert.ok(index.vectors.length > 10);
    let valid = 0;
    let invalid = 0;
    for (const v of index.vectors) {
      const bytes = new Uint8Array(readFileSync(path.join(vecDir, v.file)));
      if (v.error) {
        assert.equal(
          code(() => decodeFrame(bytes)),
          v.error,
          v.name,
        );
        // the stream decoder agrees
        const d = new StreamDecoder();
        const evs = d.push(bytes);
        const end = d.end();
        const errs = [...evs, ...(end ? [end] : [])].filter((e) => e.kind === "error");
        assert.equal(
          errs.length > 0 && errs[0].kind === "error" && errs[0].error.code,
          v.error,
          v.name,
        );
        invalid++;
      } else {
        const m = decodeFrame(bytes);
        assert.deepEqual(m.header, v.header, v.name);
        assert.deepEqual(m.buffers.map(hex), v.buffers_hex, v.name);
        const emitted = encodeFrame(v.header as Header, (v.buffers_hex ?? []).map(fromHex));
        assert.equal(hex(emitted), hex(bytes), `emit ${v.name}`);
        valid++;
      }
    }
    assert.ok(valid > 0 && invalid > 0);
  },
);
