// edgefn guest SDK for AssemblyScript (reactor ABI). Compile with the stub runtime:
//   npx asc fn.ts -O3 --runtime stub --use abort= -o fn.wasm
// and re-export the ABI from your entry file:
//   export { edgefn_alloc, edgefn_handle } from "../../sdk/assemblyscript/edgefn";
// then define `export function handle(req: Request): Response` there and register it
// with `setHandler(handle)` at the top level.
//
// Route captures: for a route `/users/:id/*`, `req.params.get("id")` is the captured
// segment and `req.params.get("*")` the rest of the path, both as raw as `req.path`
// (still percent-encoded). They come in the request's params section, after the body
// (README "Guest ABI"); a request that ends right after the body has none.
// The caller: `req.principal.get("tenant")` (also "kind", "key_id", "subject",
// "scopes", "bot", "agent"); empty for an anonymous caller.

@external("edgefn", "kv_get")
declare function host_kv_get(ns: usize, nsLen: i32, key: usize, keyLen: i32, buf: usize, cap: i32): i64;
@external("edgefn", "kv_put")
declare function host_kv_put(ns: usize, nsLen: i32, key: usize, keyLen: i32, val: usize, valLen: i32): i64;
@external("edgefn", "kv_delete")
declare function host_kv_delete(ns: usize, nsLen: i32, key: usize, keyLen: i32): i32;
@external("edgefn", "kv_increment")
declare function host_kv_increment(ns: usize, nsLen: i32, key: usize, keyLen: i32, delta: i64): i64;
@external("edgefn", "call")
declare function host_call(name: usize, nameLen: i32, args: usize, argsLen: i32, buf: usize, cap: i32): i64;

export class Request {
  method: string = "";
  path: string = "";
  query: string = "";
  body: Uint8Array = new Uint8Array(0);
  headers: Map<string, string> = new Map<string, string>();
  env: Map<string, string> = new Map<string, string>();
  params: Map<string, string> = new Map<string, string>();
  principal: Map<string, string> = new Map<string, string>();
}

export class Response {
  /** Set by `Response.binary`: the body as raw bytes (then `body` is unused). */
  bytes: Uint8Array | null = null;
  constructor(public status: i32, public contentType: string, public body: string) {}

  /** A response whose body is raw bytes (an image, a file, an upload echoed back):
   *  `body` is a string, sent as UTF-8, which cannot carry arbitrary bytes. */
  static binary(status: i32, contentType: string, body: Uint8Array): Response {
    const r = new Response(status, contentType, "");
    r.bytes = body;
    return r;
  }
}

let userHandler: ((req: Request) => Response) | null = null;

export function setHandler(h: (req: Request) => Response): void {
  userHandler = h;
}

export function edgefn_alloc(n: i32): i32 {
  return heap.alloc(<usize>n) as i32;
}

function readStr(ptr: usize): string {
  const n = load<u32>(ptr);
  return String.UTF8.decodeUnsafe(ptr + 4, <usize>n);
}

// Reads a pairs section (u32 count, then name/value strings) at p into `into`;
// returns the address after it.
function readPairs(p: usize, into: Map<string, string>): usize {
  const count = load<u32>(p); p += 4;
  for (let i: u32 = 0; i < count; i++) {
    const k = readStr(p); p += 4 + load<u32>(p);
    const v = readStr(p); p += 4 + load<u32>(p);
    into.set(k, v);
  }
  return p;
}

export function edgefn_handle(ptr: i32, len: i32): i64 {
  let p = <usize>ptr + 4; // skip "EFQ1"
  const end = <usize>ptr + <usize>len;
  const req = new Request();
  req.method = readStr(p); p += 4 + load<u32>(p);
  req.path = readStr(p); p += 4 + load<u32>(p);
  req.query = readStr(p); p += 4 + load<u32>(p);
  p = readPairs(p, req.headers);
  p = readPairs(p, req.env);
  const bodyLen = load<u32>(p);
  const body = new Uint8Array(bodyLen);
  memory.copy(body.dataStart, p + 4, bodyLen);
  req.body = body;
  p += 4 + bodyLen;
  if (end - p >= 4) p = readPairs(p, req.params); // absent: no params
  if (end - p >= 4) readPairs(p, req.principal); // anonymous: none
  return encode(userHandler!(req));
}

function encode(r: Response): i64 {
  const ct = String.UTF8.encode(r.contentType);
  const raw = r.bytes;
  const body = raw !== null ? raw.buffer : String.UTF8.encode(r.body);
  const start = raw !== null ? raw.dataStart : changetype<usize>(body);
  const bodyLen = raw !== null ? raw.byteLength : body.byteLength;
  const size = 8 + 4 + 12 + 4 + ct.byteLength + 4 + bodyLen;
  const out = heap.alloc(<usize>size);
  let p = out;
  store<u32>(p, r.status); store<u32>(p + 4, 1); p += 8;
  store<u32>(p, 12); p += 4;
  memory.copy(p, changetype<usize>(String.UTF8.encode("content-type")), 12); p += 12;
  store<u32>(p, ct.byteLength); p += 4;
  memory.copy(p, changetype<usize>(ct), <usize>ct.byteLength); p += ct.byteLength;
  store<u32>(p, bodyLen); p += 4;
  memory.copy(p, start, <usize>bodyLen);
  return (<i64>out << 32) | <i64>size;
}

// -- bindings ---------------------------------------------------------------------------------

export function kvIncrement(ns: string, key: string, delta: i64 = 1): i64 {
  const n = String.UTF8.encode(ns), k = String.UTF8.encode(key);
  return host_kv_increment(changetype<usize>(n), n.byteLength, changetype<usize>(k),
                           k.byteLength, delta);
}

export function kvPut(ns: string, key: string, value: string): i64 {
  const n = String.UTF8.encode(ns), k = String.UTF8.encode(key), v = String.UTF8.encode(value);
  return host_kv_put(changetype<usize>(n), n.byteLength, changetype<usize>(k), k.byteLength,
                     changetype<usize>(v), v.byteLength);
}

/** `kvPut` of raw bytes (a string value is stored as its UTF-8). */
export function kvPutBytes(ns: string, key: string, value: Uint8Array): i64 {
  const n = String.UTF8.encode(ns), k = String.UTF8.encode(key);
  return host_kv_put(changetype<usize>(n), n.byteLength, changetype<usize>(k), k.byteLength,
                     value.dataStart, value.byteLength);
}

export function kvDelete(ns: string, key: string): bool {
  const n = String.UTF8.encode(ns), k = String.UTF8.encode(key);
  return host_kv_delete(changetype<usize>(n), n.byteLength, changetype<usize>(k), k.byteLength) == 1;
}

/** The value as a string (decoded as UTF-8), or null if absent. */
export function kvGet(ns: string, key: string): string | null {
  const v = kvGetBytes(ns, key);
  return v === null ? null : String.UTF8.decodeUnsafe(v.dataStart, <usize>v.byteLength);
}

/** The value as raw bytes, or null if absent. */
export function kvGetBytes(ns: string, key: string): Uint8Array | null {
  const len = hostRead(false, String.UTF8.encode(ns), String.UTF8.encode(key), 4096);
  if (len < 0) return null;
  const out = new Uint8Array(<i32>len);
  memory.copy(out.dataStart, fetched, <usize>len);
  return out;
}

/** Any binding ("vectors.query", ...) with JSON args; its JSON result. */
export function call(name: string, argsJson: string): string {
  const len = hostRead(true, String.UTF8.encode(name), String.UTF8.encode(argsJson), 8192);
  if (len < 0) unreachable(); // no binding answers "none"
  return String.UTF8.decodeUnsafe(fetched, <usize>len);
}

const TRIES = 8;
let fetched: usize = 0; // where `hostRead` left the bytes

// Calls kv_get (or `call`), which fills (buf, cap) and returns the full length (-1: none):
// first with a `cap`-byte buffer, then, while the length it reports is more than the
// buffer holds, again with a buffer of that length (the value may have grown in between,
// or be gone: another writer). Returns the length, the bytes at `fetched` (negative:
// none). A length that changed on each of TRIES calls, or one no buffer can have, traps
// (unreachable).
function hostRead(isCall: bool, a: ArrayBuffer, b: ArrayBuffer, cap: i32): i64 {
  let buf = heap.alloc(<usize>cap);
  let len = fill(isCall, a, b, buf, cap);
  for (let tries = 1; len > <i64>cap; tries++) {
    if (tries == TRIES || len > <i64>i32.MAX_VALUE) unreachable();
    heap.free(buf); // the last block: the next one reuses it
    cap = <i32>len;
    buf = heap.alloc(<usize>cap);
    len = fill(isCall, a, b, buf, cap);
  }
  fetched = buf;
  return len;
}

function fill(isCall: bool, a: ArrayBuffer, b: ArrayBuffer, buf: usize, cap: i32): i64 {
  const ap = changetype<usize>(a), bp = changetype<usize>(b);
  return isCall ? host_call(ap, a.byteLength, bp, b.byteLength, buf, cap)
                : host_kv_get(ap, a.byteLength, bp, b.byteLength, buf, cap);
}
