// The framework-independent half of the SPEC §8 middleware: header parsing,
// the ledger key, the request fingerprint, the stored-response format and
// the problem answers. The byte layouts are in sdk/MIDDLEWARE-KEYS.md; the
// Python middleware (settle_client/_mw.py) implements the same ones and both
// are tested against sdk/middleware-vectors.json.
import { canonicalize, sha256Hex } from './jcs.js';

export const NOT_COMMITTED_STATUSES: ReadonlySet<number> = new Set([408, 409, 425, 429]);
export const DEFAULT_STORED_HEADERS: readonly string[] = ['content-type', 'location'];
export const DEFAULT_MAX_STORED_BODY = 32 * 1024;
const RESULT_VERSION = 1;

/** The Idempotency-Key header is malformed or sent twice. */
export class KeyHeaderError extends Error {
  readonly code: 'idempotency_key_missing' | 'idempotency_key_invalid';
  constructor(code: 'idempotency_key_missing' | 'idempotency_key_invalid', message: string) {
    super(message);
    this.code = code;
  }
}

function visible(s: string): boolean {
  if (s.length < 1 || s.length > 255) return false;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

/** The key of the Idempotency-Key field lines: null when absent; an RFC 8941
 * sf-string ("abc") or a bare token (abc), 1–255 visible ASCII after
 * unquoting; sent twice → idempotency_key_invalid. */
export function parseIdempotencyKey(values: readonly string[]): string | null {
  if (values.length === 0) return null;
  if (values.length > 1) throw new KeyHeaderError('idempotency_key_invalid', 'the Idempotency-Key header was sent more than once');
  const v = (values[0] as string).replace(/^[ \t]+|[ \t]+$/g, '');
  let key = v;
  if (v.startsWith('"')) {
    if (v.length < 2 || !v.endsWith('"')) throw new KeyHeaderError('idempotency_key_invalid', 'unterminated sf-string in Idempotency-Key');
    let out = '';
    for (let i = 1; i < v.length - 1; i++) {
      const c = v[i] as string;
      if (c === '\\') {
        const n = v[i + 1];
        if (i + 1 >= v.length - 1 || (n !== '"' && n !== '\\')) {
          throw new KeyHeaderError('idempotency_key_invalid', 'bad escape in the Idempotency-Key sf-string');
        }
        out += n;
        i++;
        continue;
      }
      const code = c.charCodeAt(0);
      if (c === '"' || code < 0x20 || code > 0x7e) {
        throw new KeyHeaderError('idempotency_key_invalid', 'bad character in the Idempotency-Key sf-string');
      }
      out += c;
    }
    key = out;
  }
  if (!visible(key)) throw new KeyHeaderError('idempotency_key_invalid', 'the Idempotency-Key must be 1-255 visible ASCII characters');
  return key;
}

const enc = new TextEncoder();
const utf8 = (s: string) => enc.encode(s);

/** Each field as a 4-byte big-endian length followed by its bytes. */
export function frame(...fields: Uint8Array[]): Buffer {
  const parts: Buffer[] = [];
  for (const f of fields) {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(f.length, 0);
    parts.push(len, Buffer.from(f.buffer, f.byteOffset, f.byteLength));
  }
  return Buffer.concat(parts);
}

/** SPEC §8 scope: `mw-` + hex SHA-256 of the framed namespace, principal and
 * (unquoted) header value, all UTF-8. */
export function ledgerKey(namespace: string, principal: string, key: string): string {
  return 'mw-' + sha256Hex(frame(utf8(namespace), utf8(principal), utf8(key)));
}

function isJsonMedia(contentType: string): boolean {
  const media = (contentType.split(';', 1)[0] ?? '').trim().toLowerCase();
  return media === 'application/json' || media.endsWith('+json');
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body bytes, then each configured header as name (lower case)
 * and value, sorted by name. With canonicalJson, a body of a JSON media
 * type that parses is replaced by its RFC 8785 form. */
export function requestFingerprint(
  method: string,
  target: string,
  contentType: string,
  body: Uint8Array,
  headers: ReadonlyArray<readonly [string, string]> = [],
  canonicalJson = false,
): string {
  let b: Uint8Array = body;
  if (canonicalJson && body.length > 0 && isJsonMedia(contentType)) {
    try {
      b = utf8(canonicalize(JSON.parse(strictUtf8.decode(body))));
    } catch {
      // not JSON after all: the raw bytes count
    }
  }
  const parts: Uint8Array[] = [utf8(method.toUpperCase()), utf8(target), utf8(contentType), b];
  const hs = headers.map(([n, v]) => [n.toLowerCase(), v] as const).sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0));
  for (const [n, v] of hs) parts.push(utf8(n), utf8(v));
  return sha256Hex(frame(...parts));
}

/** SHA-256 hex of the Authorization header value, or `anonymous`. */
export function defaultPrincipal(authorization: string | undefined | null): string {
  return authorization == null ? 'anonymous' : sha256Hex(utf8(authorization));
}

/** The claim's binding.principal: the principal when it fits the key syntax, else `sha256:` + its digest. */
export function bindingPrincipal(principal: string): string {
  return visible(principal) ? principal : 'sha256:' + sha256Hex(utf8(principal));
}

/** The claim's `worker` field, for operators. */
export function workerLabel(key: string, principal: string): string {
  return `idempotency-key=${key} principal=${bindingPrincipal(principal)}`;
}

export interface StoredResponse {
  status: number;
  headers: [string, string][];
  /** null: too large, only its digest was stored */
  body: Buffer | null;
}

export function responseSha256(status: number, body: Uint8Array): string {
  return sha256Hex(frame(utf8(String(status)), body));
}

/** The settled `result` for a response, and its response_sha256. */
export function encodeResponse(
  status: number,
  headers: ReadonlyArray<readonly [string, string]>,
  body: Uint8Array,
  storedNames: Iterable<string>,
  maxBody: number,
): { result: Record<string, unknown>; responseSha256: string } {
  // The replay sets its own content-length; framing headers are never stored.
  const names = new Set([...storedNames].map((n) => n.toLowerCase()).filter((n) => n !== 'content-length' && n !== 'transfer-encoding'));
  const kept = headers.filter(([n]) => names.has(n.toLowerCase())).map(([n, v]) => [n.toLowerCase(), v]);
  const result: Record<string, unknown> = { v: RESULT_VERSION, status, headers: kept };
  if (body.length <= maxBody) {
    result.body = Buffer.from(body).toString('base64');
  } else {
    result.body = null;
    result.body_bytes = body.length;
    result.body_sha256 = sha256Hex(body);
  }
  return { result, responseSha256: responseSha256(status, body) };
}

const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/** A stored response, or null when `result` is not one. */
export function decodeResponse(result: unknown): StoredResponse | null {
  if (!result || typeof result !== 'object' || Array.isArray(result)) return null;
  const r = result as Record<string, unknown>;
  if (r.v !== RESULT_VERSION || !Number.isInteger(r.status) || !Array.isArray(r.headers)) return null;
  const hs: [string, string][] = [];
  for (const h of r.headers as unknown[]) {
    if (!Array.isArray(h) || h.length !== 2 || typeof h[0] !== 'string' || typeof h[1] !== 'string') return null;
    hs.push([h[0], h[1]]);
  }
  if (r.body === null || r.body === undefined) return { status: r.status as number, headers: hs, body: null };
  if (typeof r.body !== 'string' || !B64.test(r.body)) return null;
  return { status: r.status as number, headers: hs, body: Buffer.from(r.body, 'base64') };
}

const TITLES: Record<string, string> = {
  idempotency_key_missing: 'Idempotency-Key missing',
  idempotency_key_invalid: 'Idempotency-Key invalid',
  idempotency_key_reused: 'Idempotency-Key reused',
  request_in_progress: 'Request in progress',
  outcome_unknown: 'Outcome unknown',
  idempotency_unavailable: 'Idempotency unavailable',
  response_not_stored: 'Response not stored',
  payload_too_large: 'Payload too large',
};

/** An RFC 9457 problem+json body with the extra `code` member. */
export function problemBody(status: number, code: string, detail: string): Buffer {
  return Buffer.from(JSON.stringify({ type: `urn:settle:problem:${code}`, title: TITLES[code] ?? code, status, detail, code }));
}

/** Whole seconds, at least 1 (SPEC §8). */
export function retryAfterHeader(retryAfterMs: number): string {
  return String(Math.max(1, Math.ceil(retryAfterMs / 1000)));
}
