// qf-worker/1 framing and canonical JSON (docs/protocol.md, sections 1 and 5).
//
// A frame: "QFW1", u32 LE header length H, u64 LE body length B, H bytes of UTF-8
// JSON, zero padding to a multiple of 8, then the buffers the header's "buffers"
// member declares, each zero-padded to a multiple of 8.

export const PROTOCOL = "qf-worker/1";
export const MAGIC = [0x51, 0x46, 0x57, 0x31]; // "QFW1"
export const PREFIX_BYTES = 16;
export const MAX_HEADER_BYTES = 16 * 1024 * 1024;
export const MAX_SAFE = Number.MAX_SAFE_INTEGER; // 2**53 - 1

export type ErrorCode =
  | "version"
  | "frame"
  | "truncated"
  | "too_large"
  | "bad_request"
  | "unknown_handle"
  | "budget"
  | "unsupported"
  | "device"
  | "internal";

export const ERROR_CODES: readonly ErrorCode[] = [
  "version",
  "frame",
  "truncated",
  "too_large",
  "bad_request",
  "unknown_handle",
  "budget",
  "unsupported",
  "device",
  "internal",
];

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export type Header = { [key: string]: Json };

export interface Message {
  header: Header;
  buffers: Uint8Array[];
}

/** An error carrying a protocol error code (and, optionally, the handle it concerns). */
export class ProtocolError extends Error {
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly handle: number | null = null,
  ) {
    super(message);
    this.name = "ProtocolError";
  }
}

export function pad8(n: number): number {
  return Math.ceil(n / 8) * 8;
}

// ----------------------------------------------------------------------------- JSON

/** Parse strict JSON whose numbers are integers in [-(2**53-1), 2**53-1]; throws `frame`. */
export function parseStrictJson(text: string): Json {
  let i = 0;
  const fail = (what: string): never => {
    throw new ProtocolError(
      "frame",
      `header is not valid qf-worker/1 JSON: ${what} at character ${i}; send canonical JSON ` +
        "(integers only, no fractions or exponents)",
    );
  };
  const ws = () => {
    while (i < text.length) {
      const c = text.charCodeAt(i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
      else break;
    }
  };
  const parseString = (): string => {
    i++; // opening quote
    let out = "";
    for (;;) {
      if (i >= text.length) fail("unterminated string");
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return out;
      }
      if (c < 0x20) fail("raw control character in a string");
      if (c === 0x5c) {
        const e = text[i + 1];
        i += 2;
        switch (e) {
          case '"':
            out += '"';
            break;
          case "\\":
            out += "\\";
            break;
          case "/":
            out += "/";
            break;
          case "b":
            out += "\b";
            break;
          case "f":
            out += "\f";
            break;
          case "n":
            out += "\n";
            break;
          case "r":
            out += "\r";
            break;
          case "t":
            out += "\t";
            break;
          case "u": {
            const hex = text.slice(i, i + 4);
            if (!/^[0-9a-fA-F]{4}$/.test(hex)) fail("bad \\u escape");
            out += String.fromCharCode(parseInt(hex, 16));
            i += 4;
            break;
          }
          default:
            fail("bad escape");
        }
      } else {
        out += text[i];
        i++;
      }
    }
  };
  const parseNumber = (): number => {
    const m = /^-?(0|[1-9][0-9]*)/.exec(text.slice(i, i + 40));
    if (!m) return fail("bad number");
    const next = text[i + m[0].length];
    if (next === "." || next === "e" || next === "E") fail("non-integer number");
    const v = Number(m[0]);
    if (!Number.isSafeInteger(v)) fail(`integer ${m[0]} outside [-(2**53-1), 2**53-1]`);
    i += m[0].length;
    return v === 0 ? 0 : v; // -0 -> 0
  };
  const parseValue = (depth: number): Json => {
    if (depth > 64) fail("nesting deeper than 64");
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const obj: { [k: string]: Json } = Object.create(null) as { [k: string]: Json };
      ws();
      if (text[i] === "}") {
        i++;
        return { ...obj };
      }
      for (;;) {
        ws();
        if (text[i] !== '"') fail("expected a string key");
        const k = parseString();
        ws();
        if (text[i] !== ":") fail("expected ':'");
        i++;
        obj[k] = parseValue(depth + 1);
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "}") {
          i++;
          return { ...obj };
        }
        fail("expected ',' or '}'");
      }
    }
    if (c === "[") {
      i++;
      const arr: Json[] = [];
      ws();
      if (text[i] === "]") {
        i++;
        return arr;
      }
      for (;;) {
        arr.push(parseValue(depth + 1));
        ws();
        if (text[i] === ",") {
          i++;
          continue;
        }
        if (text[i] === "]") {
          i++;
          return arr;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c === '"') return parseString();
    if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) return parseNumber();
    if (text.startsWith("true", i)) {
      i += 4;
      return true;
    }
    if (text.startsWith("false", i)) {
      i += 5;
      return false;
    }
    if (text.startsWith("null", i)) {
      i += 4;
      return null;
    }
    return fail("unexpected token");
  };
  const v = parseValue(0);
  ws();
  if (i !== text.length) fail("trailing characters");
  return v;
}

function escapeString(s: string): string {
  let out = '"';
  for (let k = 0; k < s.length; k++) {
    const c = s.charCodeAt(k);
    if (c === 0x22) out += '\\"';
    else if (c === 0x5c) out += "\\\\";
    else if (c === 0x08) out += "\\b";
    else if (c === 0x0c) out += "\\f";
    else if (c === 0x0a) out += "\\n";
    else if (c === 0x0d) out += "\\r";
    else if (c === 0x09) out += "\\t";
    else if (c < 0x20 || c > 0x7f) out += "\\u" + c.toString(16).padStart(4, "0");
    else out += s[k];
  }
  return out + '"';
}

/** Canonical JSON: sorted keys, no whitespace, integers only, non-ASCII as lowercase \uXXXX. */
export function canonicalJson(v: Json): string {
  if (v === null) return "null";
  if (v === true) return "true";
  if (v === false) return "false";
  if (typeof v === "number") {
    if (!Number.isSafeInteger(v)) {
      throw new ProtocolError(
        "internal",
        `canonical JSON holds integers in [-(2**53-1), 2**53-1] only, got ${v}`,
      );
    }
    return String(v === 0 ? 0 : v);
  }
  if (typeof v === "string") return escapeString(v);
  if (Array.isArray(v)) return "[" + v.map(canonicalJson).join(",") + "]";
  const keys = Object.keys(v)
    .filter((k) => v[k] !== undefined)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)); // UTF-16 order == code point order for ASCII
  return "{" + keys.map((k) => escapeString(k) + ":" + canonicalJson(v[k])).join(",") + "}";
}

// ----------------------------------------------------------------------------- frames

const utf8 = new TextEncoder();

/**
 * Emit one frame. `header.buffers` is set to the buffers' lengths when there are
 * buffers (or when the header already names a `buffers` member); otherwise absent.
 */
export function encodeFrame(header: Header, buffers: Uint8Array[] = []): Uint8Array {
  const h: Header = { ...header };
  if (buffers.length > 0 || "buffers" in h) h.buffers = buffers.map((b) => b.byteLength);
  const json = utf8.encode(canonicalJson(h));
  if (json.byteLength > MAX_HEADER_BYTES) {
    throw new ProtocolError("internal", `header of ${json.byteLength} bytes exceeds 16 MiB`);
  }
  const start = pad8(PREFIX_BYTES + json.byteLength);
  let body = 0;
  for (const b of buffers) body += pad8(b.byteLength);
  const out = new Uint8Array(start + body);
  out.set(MAGIC, 0);
  const dv = new DataView(out.buffer);
  dv.setUint32(4, json.byteLength, true);
  dv.setBigUint64(8, BigInt(body), true);
  out.set(json, PREFIX_BYTES);
  let off = start;
  for (const b of buffers) {
    out.set(b, off);
    off += pad8(b.byteLength);
  }
  return out;
}

const utf8Fatal = new TextDecoder("utf-8", { fatal: true });

function parseHeaderBytes(bytes: Uint8Array): Header {
  let text: string;
  try {
    text = utf8Fatal.decode(bytes);
  } catch {
    throw new ProtocolError("frame", "header is not valid UTF-8; send UTF-8 JSON");
  }
  const v = parseStrictJson(text);
  if (v === null || typeof v !== "object" || Array.isArray(v)) {
    throw new ProtocolError("frame", "header must be a JSON object");
  }
  if (typeof v.type !== "string") {
    throw new ProtocolError(
      "frame",
      `header member "type" must be a string, got ${JSON.stringify(v.type ?? null)}`,
    );
  }
  const b = v.buffers;
  if (b !== undefined && b !== null) {
    if (!Array.isArray(b) || !b.every((x) => typeof x === "number" && x >= 0)) {
      throw new ProtocolError(
        "frame",
        `header member "buffers" must be a list of non-negative integers, got ${JSON.stringify(b)}`,
      );
    }
  } else if (b === null) {
    throw new ProtocolError("frame", 'header member "buffers" must be a list, got null');
  }
  return v;
}

function bufferLengths(h: Header): number[] {
  return Array.isArray(h.buffers) ? (h.buffers as number[]) : [];
}

interface Prefix {
  headerLength: number;
  bodyLength: number; // may exceed 2**53 only as Infinity
}

function readPrefix(bytes: Uint8Array, at: number): Prefix {
  for (let k = 0; k < 4; k++) {
    if (bytes[at + k] !== MAGIC[k]) {
      throw new ProtocolError(
        "frame",
        `bad magic ${JSON.stringify(String.fromCharCode(...bytes.subarray(at, at + 4)))}, expected "QFW1"`,
      );
    }
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset + at, PREFIX_BYTES);
  const headerLength = dv.getUint32(4, true);
  if (headerLength > MAX_HEADER_BYTES) {
    throw new ProtocolError(
      "frame",
      `header_length ${headerLength} exceeds the limit of ${MAX_HEADER_BYTES} bytes`,
    );
  }
  const big = dv.getBigUint64(8, true);
  const bodyLength = big > BigInt(MAX_SAFE) ? Infinity : Number(big);
  return { headerLength, bodyLength };
}

function checkBody(h: Header, bodyLength: number): number[] {
  const lens = bufferLengths(h);
  let want = 0;
  for (const L of lens) want += pad8(L);
  if (want !== bodyLength) {
    throw new ProtocolError(
      "frame",
      `body_length ${bodyLength} != sum(pad8(buffers)) = ${want} for buffers ${JSON.stringify(lens)}`,
    );
  }
  return lens;
}

function zeros(bytes: Uint8Array, from: number, to: number): boolean {
  for (let k = from; k < to; k++) if (bytes[k] !== 0) return false;
  return true;
}

/** Parse exactly one complete frame (a whole WebSocket message or a golden vector file). */
export function decodeFrame(bytes: Uint8Array, maxMessageBytes = Infinity): Message {
  if (bytes.byteLength < PREFIX_BYTES) {
    if (bytes.byteLength >= 4) readPrefixMagicOnly(bytes);
    throw new ProtocolError("truncated", `frame of ${bytes.byteLength} bytes ends in its prefix`);
  }
  const { headerLength, bodyLength } = readPrefix(bytes, 0);
  const start = pad8(PREFIX_BYTES + headerLength);
  if (bytes.byteLength < PREFIX_BYTES + headerLength) {
    throw new ProtocolError("truncated", "the frame ends inside its header");
  }
  const header = parseHeaderBytes(bytes.subarray(PREFIX_BYTES, PREFIX_BYTES + headerLength));
  const lens = checkBody(header, bodyLength);
  if (bytes.byteLength < start)
    throw new ProtocolError("truncated", "the frame ends in its header padding");
  checkHeaderPadding(bytes, headerLength);
  const total = start + bodyLength;
  if (total > maxMessageBytes) {
    throw new ProtocolError(
      "too_large",
      `frame of ${total} bytes exceeds max_message_bytes ${maxMessageBytes}; split the payload into smaller chunks`,
      typeof header.handle === "number" ? header.handle : null,
    );
  }
  if (bytes.byteLength < total) {
    throw new ProtocolError(
      "truncated",
      `frame declares ${total} bytes, only ${bytes.byteLength} present`,
    );
  }
  if (bytes.byteLength > total) {
    throw new ProtocolError(
      "frame",
      `${bytes.byteLength - total} bytes after the frame's declared end (${total} bytes)`,
    );
  }
  return { header, buffers: sliceBuffers(bytes, start, lens) };
}

function readPrefixMagicOnly(bytes: Uint8Array): void {
  for (let k = 0; k < 4; k++) {
    if (bytes[k] !== MAGIC[k]) throw new ProtocolError("frame", 'bad magic, expected "QFW1"');
  }
}

function sliceBuffers(bytes: Uint8Array, start: number, lens: number[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  let off = start;
  for (const L of lens) {
    if (!zeros(bytes, off + L, off + pad8(L))) {
      throw new ProtocolError("frame", `non-zero padding after a buffer of ${L} bytes`);
    }
    // Copy into a fresh, 8-aligned ArrayBuffer so typed views work in place.
    out.push(bytes.slice(off, off + L));
    off += pad8(L);
  }
  return out;
}

/** The header-padding check shared by both decoders. */
function checkHeaderPadding(bytes: Uint8Array, headerLength: number): void {
  const from = PREFIX_BYTES + headerLength;
  if (!zeros(bytes, from, pad8(from))) {
    throw new ProtocolError("frame", "non-zero padding after the header");
  }
}

/** A decoded frame, or an error with the id of the frame (when the header was readable). */
export type DecodeEvent =
  | { kind: "message"; message: Message }
  | { kind: "error"; error: ProtocolError; id: number | null; fatal: boolean };

/**
 * Incremental decoder for a byte stream (pipes). Feed chunks with `push`; complete
 * frames come out in order. After a `frame` error the stream cannot be resynchronised:
 * the decoder stops (fatal). A frame over `maxMessageBytes` is reported as `too_large`
 * with its id and its body is skipped, so the stream stays usable.
 */
export class StreamDecoder {
  private chunks: Uint8Array[] = [];
  private size = 0;
  private skip = 0;
  private dead = false;

  constructor(public maxMessageBytes = Infinity) {}

  get buffered(): number {
    return this.size;
  }

  get failed(): boolean {
    return this.dead;
  }

  push(chunk: Uint8Array): DecodeEvent[] {
    const events: DecodeEvent[] = [];
    if (this.dead) return events;
    if (this.skip > 0) {
      const n = Math.min(this.skip, chunk.byteLength);
      this.skip -= n;
      chunk = chunk.subarray(n);
    }
    if (chunk.byteLength > 0) {
      this.chunks.push(chunk);
      this.size += chunk.byteLength;
    }
    for (;;) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, this.size);
        this.consume(n);
        this.skip -= n;
        if (this.skip > 0) break;
      }
      if (this.size < PREFIX_BYTES) {
        if (this.size >= 4) {
          const head = this.peek(4);
          try {
            readPrefixMagicOnly(head);
          } catch (e) {
            this.dead = true;
            events.push({ kind: "error", error: e as ProtocolError, id: null, fatal: true });
          }
        }
        break;
      }
      const pre = this.peek(PREFIX_BYTES);
      let prefix: Prefix;
      try {
        prefix = readPrefix(pre, 0);
      } catch (e) {
        this.dead = true;
        events.push({ kind: "error", error: e as ProtocolError, id: null, fatal: true });
        break;
      }
      const start = pad8(PREFIX_BYTES + prefix.headerLength);
      if (this.size < start) break;
      const head = this.peek(start);
      let header: Header;
      try {
        header = parseHeaderBytes(head.subarray(PREFIX_BYTES, PREFIX_BYTES + prefix.headerLength));
        checkBody(header, prefix.bodyLength);
        checkHeaderPadding(head, prefix.headerLength);
      } catch (e) {
        this.dead = true;
        events.push({ kind: "error", error: e as ProtocolError, id: null, fatal: true });
        break;
      }
      const id = typeof header.id === "number" ? header.id : null;
      const total = start + prefix.bodyLength;
      if (total > this.maxMessageBytes) {
        events.push({
          kind: "error",
          error: new ProtocolError(
            "too_large",
            `frame of ${total} bytes exceeds max_message_bytes ${this.maxMessageBytes}; ` +
              "send smaller chunks (the frame was skipped)",
            typeof header.handle === "number" ? header.handle : null,
          ),
          id,
          fatal: false,
        });
        this.consume(start);
        this.skip = prefix.bodyLength;
        continue;
      }
      if (this.size < total) break;
      const whole = this.peek(total);
      this.consume(total);
      try {
        events.push({
          kind: "message",
          message: { header, buffers: sliceBuffers(whole, start, bufferLengths(header)) },
        });
      } catch (e) {
        this.dead = true;
        events.push({ kind: "error", error: e as ProtocolError, id, fatal: true });
        break;
      }
    }
    return events;
  }

  /** Call at end of stream: a partial frame left over is `truncated`. */
  end(): DecodeEvent | null {
    if (this.dead || (this.size === 0 && this.skip === 0)) return null;
    this.dead = true;
    return {
      kind: "error",
      error: new ProtocolError(
        "truncated",
        `the stream ended inside a frame (${this.size} bytes buffered)`,
      ),
      id: null,
      fatal: true,
    };
  }

  private peek(n: number): Uint8Array {
    if (this.chunks[0] && this.chunks[0].byteLength >= n) return this.chunks[0].subarray(0, n);
    const out = new Uint8Array(n);
    let off = 0;
    for (const c of this.chunks) {
      const take = Math.min(c.byteLength, n - off);
      out.set(c.subarray(0, take), off);
      off += take;
      if (off >= n) break;
    }
    // Merge so later peeks are cheap.
    const rest = this.size - n;
    const merged: Uint8Array[] = [out];
    if (rest > 0) {
      let skipped = 0;
      for (const c of this.chunks) {
        if (skipped + c.byteLength <= n) {
          skipped += c.byteLength;
          continue;
        }
        merged.push(c.subarray(Math.max(0, n - skipped)));
        skipped += c.byteLength;
      }
    }
    this.chunks = merged;
    return out;
  }

  private consume(n: number): void {
    this.size -= n;
    while (n > 0) {
      const c = this.chunks[0];
      if (c.byteLength <= n) {
        n -= c.byteLength;
        this.chunks.shift();
      } else {
        this.chunks[0] = c.subarray(n);
        n = 0;
      }
    }
  }
}

export function hex(b: Uint8Array): string {
  let s = "";
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return s;
}

export function fromHex(s: string): Uint8Array {
  const out = new Uint8Array(s.length / 2);
  for (let k = 0; k < out.length; k++) out[k] = parseInt(s.slice(2 * k, 2 * k + 2), 16);
  return out;
}
