// The framework-independent half of the SPEC §8 middleware: header parsing,
// the ledger key, the request fingerprint, the stored-response format, the
// problem answers, and (at the end) the engine that takes every SPEC §8
// decision for a request — claim, replay, wait, reconcile, dispatch, settle,
// release — on which the Express, Fastify and Fetch adapters are built. The
// byte layouts are in sdk/MIDDLEWARE-KEYS.md; the Python middleware
// (settle_client/_mw.py) implements the same ones and both are tested
// against sdk/middleware-vectors.json.
import type { IncomingMessage } from 'node:http';
import type { Client } from './client.js';
import { DeadlineExceeded, EffectNotSent, NotFound, ProblemError, RecordRefused, StaleBinding, TransportError, Unavailable } from './errors.js';
import { BindingMismatch, FingerprintMismatch, InvalidRequest, ReceiptRequired } from './errors.js';
import { FingerprintError, canonicalize, newClaimId, parsePointer, selectFields, sha256Hex } from './jcs.js';
import type { Binding, Grant, InFlight, Receipt } from './types.js';
import { Deadline, askHook, retrying, startHeartbeat, type Heartbeat, type LeaseClock } from './worker.js';

/** The default `releaseOn`: responses that say nothing happened (SPEC §8). */
export const NOT_COMMITTED_STATUSES: ReadonlySet<number> = new Set([408, 409, 425, 429]);
/** The default `ledgerDeadlineMs`: how long the calls before the handler
 * (claim, dispatch) are retried when settle does not answer. */
export const DEFAULT_LEDGER_DEADLINE_MS = 2000;
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

function invalid(message: string): KeyHeaderError {
  return new KeyHeaderError('idempotency_key_invalid', message);
}

/** The RFC 8941 sf-string that starts at v[i] (a `"`): its unescaped text
 * and the index after its closing quote. Escapes `\"` and `\\` only;
 * characters 0x20–0x7E. */
function sfString(v: string, i: number): [string, number] {
  let out = '';
  for (i++; i < v.length; i++) {
    const c = v[i] as string;
    if (c === '\\') {
      const n = v[i + 1];
      if (n !== '"' && n !== '\\') throw invalid('bad escape in an Idempotency-Key sf-string');
      out += n;
      i++;
    } else if (c === '"') {
      return [out, i + 1];
    } else {
      const code = c.charCodeAt(0);
      if (code < 0x20 || code > 0x7e) throw invalid('bad character in an Idempotency-Key sf-string');
      out += c;
    }
  }
  throw invalid('unterminated sf-string in Idempotency-Key');
}

const badParameter = (what: string) => invalid(`malformed parameter after the Idempotency-Key sf-string: ${what}`);
const KEY = /[a-z*][a-z0-9_.*-]*/y;
const TOKEN = /[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*/y;
const NUMBER = /-?[0-9]+(\.[0-9]*)?/y;
const BYTES = /:[A-Za-z0-9+/=]*:/y;

/** The match of the sticky `re` starting exactly at v[i], or null. */
function matchAt(re: RegExp, v: string, i: number): RegExpExecArray | null {
  re.lastIndex = i;
  return re.exec(v);
}

/** The index after the RFC 8941 bare item at v[i]: an sf-string, a token,
 * an integer or decimal, a byte sequence or a boolean. */
function bareItemEnd(v: string, i: number): number {
  const c = v[i];
  if (c === undefined) throw badParameter("a value is missing after '='");
  if (c === '"') return sfString(v, i)[1];
  if (c === '-' || (c >= '0' && c <= '9')) {
    const m = matchAt(NUMBER, v, i);
    if (!m) throw badParameter('a number has at least one digit');
    const [whole, frac] = m[0].replace(/^-/, '').split('.') as [string, string | undefined];
    if (frac === undefined ? whole.length > 15 : whole.length > 12 || frac.length < 1 || frac.length > 3) {
      throw badParameter('an integer has 1-15 digits, a decimal 1-12 integer and 1-3 fraction digits');
    }
    return i + m[0].length;
  }
  if (c === ':') {
    const m = matchAt(BYTES, v, i);
    if (!m) throw badParameter('a byte sequence is base64 between colons');
    return i + m[0].length;
  }
  if (c === '?') {
    if (v[i + 1] === '0' || v[i + 1] === '1') return i + 2;
    throw badParameter('a boolean is ?0 or ?1');
  }
  const m = matchAt(TOKEN, v, i);
  if (!m) throw badParameter(`unexpected ${JSON.stringify(c)}`);
  return i + m[0].length;
}

/** Checks that v[i..] is zero or more RFC 8941 parameters (then ignored):
 * `;`, spaces (SP only), a key, optionally `=` and a bare item. */
function skipParameters(v: string, i: number): void {
  while (i < v.length) {
    if (v[i] !== ';') throw invalid('unexpected characters after the Idempotency-Key sf-string');
    i++;
    while (v[i] === ' ') i++;
    const k = matchAt(KEY, v, i);
    if (!k) throw badParameter("a key is lower-case letters, digits and '_-.*', starting with a letter or '*'");
    i += k[0].length;
    if (v[i] === '=') i = bareItemEnd(v, i + 1);
  }
}

/** The key of the Idempotency-Key field lines: null when absent. After
 * trimming spaces and tabs, a value starting with `"` is an RFC 8941
 * sf-string, optionally followed by RFC 8941 parameters (parsed and
 * ignored: `"abc";a=1` is the key `abc`); any other value is the key as it
 * is (`abc;a=1` is the key `abc;a=1`). 1–255 visible ASCII after unquoting;
 * sent twice → idempotency_key_invalid. */
export function parseIdempotencyKey(values: readonly string[]): string | null {
  if (values.length === 0) return null;
  if (values.length > 1) throw invalid('the Idempotency-Key header was sent more than once');
  const v = (values[0] as string).replace(/^[ \t]+|[ \t]+$/g, '');
  let key = v;
  if (v.startsWith('"')) {
    const [text, end] = sfString(v, 0);
    skipParameters(v, end);
    key = text;
  }
  if (!visible(key)) throw invalid('the Idempotency-Key must be 1-255 visible ASCII characters');
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

/** `application/json` or any `*+json` media type (parameters and case
 * ignored; spaces and tabs around it trimmed): the bodies the fingerprint
 * reads as JSON. */
export function isJsonMedia(contentType: string): boolean {
  const media = (contentType.split(';', 1)[0] ?? '').replace(/^[ \t]+|[ \t]+$/g, '').toLowerCase();
  return media === 'application/json' || media.endsWith('+json');
}

/** A JSON body nested deeper than this (arrays and objects) is
 * fingerprinted as raw bytes, in every SDK. */
export const MAX_JSON_DEPTH = 100;

/** A middleware option refused at construction. `option` names it
 * (`canonicalJson`, `fields` or `exclude`); `code` is the shared vectors'
 * `error`: `invalid_fields`, `invalid_exclude`, `fields_and_exclude` or
 * `canonical_json_off` (and `invalid_canonical_json` for a value that is
 * not a boolean). */
export class MiddlewareConfigError extends TypeError {
  readonly code: string;
  readonly option: string;
  constructor(code: string, option: string, message: string) {
    super(message);
    this.name = 'MiddlewareConfigError';
    this.code = code;
    this.option = option;
  }
}

/** The body options of the fingerprint as given to a middleware. */
export interface FingerprintOptionsInput {
  /** RFC 8785 form of JSON bodies (default true). */
  canonicalJson?: boolean;
  /** Only these JSON pointers of the body count. */
  fields?: readonly string[];
  /** These JSON pointers of the body do not count. */
  exclude?: readonly string[];
}

/** The body options of the fingerprint, checked (`fingerprintOptions`). */
export class FingerprintOptions {
  readonly canonicalJson: boolean;
  readonly fields: readonly string[] | null;
  readonly exclude: readonly string[] | null;
  /** @internal use fingerprintOptions(), which checks */
  constructor(canonicalJson: boolean, fields: readonly string[] | null, exclude: readonly string[] | null) {
    this.canonicalJson = canonicalJson;
    this.fields = fields;
    this.exclude = exclude;
    Object.freeze(this);
  }
}

function pointerList(option: string, code: string, pointers: unknown): readonly string[] {
  if (!Array.isArray(pointers)) throw new MiddlewareConfigError(code, option, `${option} must be an array of JSON pointers (RFC 6901)`);
  if (pointers.length === 0) throw new MiddlewareConfigError(code, option, `${option} must name at least one JSON pointer`);
  for (const p of pointers) {
    if (typeof p !== 'string') throw new MiddlewareConfigError(code, option, `${option}: ${String(p)} is not a JSON pointer string`);
    try {
      parsePointer(p);
    } catch (e) {
      throw new MiddlewareConfigError(code, option, `${option}: ${(e as Error).message}`);
    }
  }
  return Object.freeze([...(pointers as string[])]);
}

/** The body options of the fingerprint, checked (sdk/MIDDLEWARE-KEYS.md):
 * `fields` and `exclude` are non-empty arrays of RFC 6901 pointers, not
 * both; `exclude` may not hold `""` (the whole document); either needs
 * `canonicalJson`. Anything else throws MiddlewareConfigError naming the
 * option. */
export function fingerprintOptions(input: FingerprintOptionsInput | FingerprintOptions = {}): FingerprintOptions {
  if (input instanceof FingerprintOptions) return input;
  const canonical = input.canonicalJson ?? true;
  if (typeof canonical !== 'boolean') throw new MiddlewareConfigError('invalid_canonical_json', 'canonicalJson', 'canonicalJson must be true or false');
  const { fields, exclude } = input;
  if (fields !== undefined && fields !== null && exclude !== undefined && exclude !== null) {
    throw new MiddlewareConfigError('fields_and_exclude', 'exclude', 'fields and exclude cannot both be given (fields keeps, exclude leaves out)');
  }
  const f = fields === undefined || fields === null ? null : pointerList('fields', 'invalid_fields', fields);
  const x = exclude === undefined || exclude === null ? null : pointerList('exclude', 'invalid_exclude', exclude);
  if (x !== null && x.includes('')) throw new MiddlewareConfigError('invalid_exclude', 'exclude', 'exclude cannot hold "" (the whole document)');
  if ((f !== null || x !== null) && !canonical) {
    const option = f !== null ? 'fields' : 'exclude';
    throw new MiddlewareConfigError('canonical_json_off', option, `${option} needs canonicalJson (the body is read as JSON, then canonicalised)`);
  }
  return new FingerprintOptions(canonical, f, x);
}

/** True when `v` nests at most `limit` arrays/objects deep. */
function depthAtMost(v: unknown, limit: number): boolean {
  const stack: [unknown, number][] = [[v, 0]];
  while (stack.length > 0) {
    const [cur, d] = stack.pop() as [unknown, number];
    if (cur !== null && typeof cur === 'object') {
      if (d + 1 > limit) return false;
      for (const c of Array.isArray(cur) ? cur : Object.values(cur as object)) stack.push([c, d + 1]);
    }
  }
  return true;
}

const INDEX = /^(0|[1-9][0-9]*)$/;

function comparePaths(a: readonly (string | number)[], b: readonly (string | number)[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const x = a[i] as string | number;
    const y = b[i] as string | number;
    if (x === y) continue;
    if (typeof x === 'number' && typeof y === 'number') return x - y;
    if (typeof x === 'number') return -1;
    if (typeof y === 'number') return 1;
    // UTF-16 code units, as Python compares code points: the order only
    // has to be total and shared by siblings (one container).
    return x < y ? -1 : 1;
  }
  return a.length - b.length;
}

/** `value` without the values at `pointers` (sdk/MIDDLEWARE-KEYS.md): every
 * pointer is resolved in the document as given (before any removal; one
 * that does not resolve is ignored), then each value found is removed, an
 * object member by its name, an array element by its index (later elements
 * shift down). Removed last-first, deepest first, so the order of the
 * pointers does not matter. `value` is changed in place and returned. */
export function excludePointers(value: unknown, pointers: readonly string[]): unknown {
  const paths: (string | number)[][] = [];
  for (const p of pointers) {
    const tokens = parsePointer(p);
    if (tokens.length === 0) throw new FingerprintError('invalid_fields', 'exclude cannot hold "" (the whole document)');
    let cur: unknown = value;
    const path: (string | number)[] = [];
    let found = true;
    for (const t of tokens) {
      if (Array.isArray(cur)) {
        if (!INDEX.test(t) || Number(t) >= cur.length) {
          found = false;
          break;
        }
        path.push(Number(t));
        cur = cur[Number(t)];
      } else if (cur !== null && typeof cur === 'object' && Object.prototype.hasOwnProperty.call(cur, t)) {
        path.push(t);
        cur = (cur as Record<string, unknown>)[t];
      } else {
        found = false;
        break;
      }
    }
    if (found) paths.push(path);
  }
  paths.sort((a, b) => comparePaths(b, a)); // descending
  let last: (string | number)[] | null = null;
  for (const path of paths) {
    if (last !== null && comparePaths(last, path) === 0) continue;
    last = path;
    let parent: unknown = value;
    for (const step of path.slice(0, -1)) parent = (parent as Record<string | number, unknown>)[step];
    const end = path[path.length - 1] as string | number;
    if (Array.isArray(parent)) parent.splice(end as number, 1);
    else delete (parent as Record<string, unknown>)[end as string];
  }
  return value;
}

const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** The body bytes that enter the fingerprint. With canonicalJson, when the
 * media type is JSON (`isJsonMedia`) and the body is not empty, is strict
 * UTF-8 (a BOM makes it not JSON), parses as JSON, nests at most
 * MAX_JSON_DEPTH deep and is accepted whole by the fingerprint helper: its
 * RFC 8785 text, after `fields` (the selection {pointer: value} of the
 * fingerprint helper) or `exclude`. Any other body: the raw bytes. */
export function fingerprintBody(options: FingerprintOptions, contentType: string, body: Uint8Array): Uint8Array {
  if (!options.canonicalJson || body.length === 0 || !isJsonMedia(contentType)) return body;
  let value: unknown;
  let whole: string;
  try {
    value = JSON.parse(strictUtf8.decode(body));
    if (!depthAtMost(value, MAX_JSON_DEPTH)) return body;
    whole = canonicalize(value); // the whole body must be JSON the helper accepts
  } catch {
    return body; // not JSON after all: the raw bytes count
  }
  if (options.fields !== null) return utf8(canonicalize(selectFields(value, options.fields)));
  if (options.exclude !== null) return utf8(canonicalize(excludePointers(value, options.exclude)));
  return utf8(whole);
}

/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body (`fingerprintBody`: by default the RFC 8785 form of a
 * JSON body), then each configured header as name (lower case) and value,
 * sorted by name. `options`: `fingerprintOptions(...)` (checked once), the
 * unchecked `{ canonicalJson, fields, exclude }` (checked on every call), or
 * a boolean for canonicalJson alone (default true). */
export function requestFingerprint(
  method: string,
  target: string,
  contentType: string,
  body: Uint8Array,
  headers: ReadonlyArray<readonly [string, string]> = [],
  options: boolean | FingerprintOptions | FingerprintOptionsInput = true,
): string {
  const opts = fingerprintOptions(typeof options === 'boolean' ? { canonicalJson: options } : options);
  const b = fingerprintBody(opts, contentType, body);
  const parts: Uint8Array[] = [utf8(method.toUpperCase()), utf8(target), utf8(contentType), b];
  const hs = headers.map(([n, v]) => [n.toLowerCase(), v] as const).sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0));
  for (const [n, v] of hs) parts.push(utf8(n), utf8(v));
  return sha256Hex(frame(...parts));
}

/** The claim's binding.principal: the principal when it fits the key syntax, else `sha256:` + its digest. */
export function bindingPrincipal(principal: string): string {
  return visible(principal) ? principal : 'sha256:' + sha256Hex(utf8(principal));
}

/** A value of the `worker` field (SPEC §8): every UTF-8 byte outside
 * `A-Za-z0-9-._~` as uppercase `%XX`. */
export function workerValue(value: string): string {
  let out = '';
  for (const b of Buffer.from(value, 'utf8')) {
    const unreserved =
      (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a) || (b >= 0x30 && b <= 0x39) || b === 0x2d || b === 0x2e || b === 0x5f || b === 0x7e;
    out += unreserved ? String.fromCharCode(b) : '%' + b.toString(16).toUpperCase().padStart(2, '0');
  }
  return out;
}

/** The claim's `worker` field (SPEC §8): `idempotency-key=<value>
 * principal=<value>`, the header value after unquoting and the principal
 * the extractor gave (not the binding's `sha256:` form), each encoded by
 * `workerValue`. Operators read it; a Reconciler parses it
 * (`parseWorkerLabel`) to hand a middleware hook the client's key and
 * principal. */
export function workerLabel(key: string, principal: string): string {
  return `idempotency-key=${workerValue(key)} principal=${workerValue(principal)}`;
}

const WORKER_LABEL = /^idempotency-key=((?:[A-Za-z0-9._~-]|%[0-9A-F]{2})+) principal=((?:[A-Za-z0-9._~-]|%[0-9A-F]{2})*)$/;

/** The Idempotency-Key value and the principal of a `worker` field written
 * by `workerLabel` (by any SDK's middleware), or null for another field. */
export function parseWorkerLabel(worker: unknown): { idempotencyKey: string; principal: string } | null {
  if (typeof worker !== 'string') return null;
  const m = WORKER_LABEL.exec(worker);
  if (!m) return null;
  try {
    return { idempotencyKey: decodeURIComponent(m[1] as string), principal: decodeURIComponent(m[2] as string) };
  } catch {
    return null; // not UTF-8
  }
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
  idempotency_forbidden: 'Idempotency forbidden',
  idempotency_principal_missing: 'Idempotency principal missing',
};

export const PRINCIPAL_MISSING_DETAIL = 'no principal was found for this request (see the principal option)';
export const UNAVAILABLE_DETAIL = 'the idempotency ledger is unreachable; the request was not run';
export const FORBIDDEN_DETAIL = "the ledger refused this caller's binding (its principal was revoked or moved on)";

/** An RFC 9457 problem+json body with the extra `code` member. */
export function problemBody(status: number, code: string, detail: string): Buffer {
  return Buffer.from(JSON.stringify({ type: `urn:settle:problem:${code}`, title: TITLES[code] ?? code, status, detail, code }));
}

/** Whole seconds, at least 1 (SPEC §8). */
export function retryAfterHeader(retryAfterMs: number): string {
  return String(Math.max(1, Math.ceil(retryAfterMs / 1000)));
}

/** SPEC §8 (amended): the `Retry-After` of `request_in_progress` in whole
 * seconds: the time the running lease has left (ceil of lease_expires_at −
 * now), at least 1, and at least the ledger's `retry_after_ms` hint. */
export function inProgressRetryAfterS(retryAfterMs: number, leaseExpiresAt: string | null | undefined, now: number = Date.now()): number {
  let s = Math.max(1, Math.ceil(retryAfterMs / 1000));
  const at = leaseExpiresAt ? Date.parse(leaseExpiresAt) : NaN;
  if (Number.isFinite(at)) s = Math.max(s, Math.ceil((at - now) / 1000));
  return s;
}

/** How the middleware answers a ledger call (claim, dispatch) that failed. */
export interface LedgerFailure {
  /** A route with failOpen may run the handler: settle gave no answer, or a 503 `unavailable`. */
  failOpen: boolean;
  status: number;
  code: 'idempotency_unavailable' | 'idempotency_forbidden';
  detail: string;
  /** The Retry-After header in whole seconds; null: none (403). */
  retryAfter: number | null;
  /** An answer the middleware has no rule for (logged as an error). */
  unexpected: boolean;
}

/** SPEC §8's rule for a claim or dispatch that failed, shared by the three
 * SDKs: no answer or 503 `unavailable` → 503 `idempotency_unavailable`
 * (fail-open allowed); `stale_binding` → 403 `idempotency_forbidden`;
 * `record_refused` and any 429 → 503 (a 429's own Retry-After, rounded up,
 * when it sent one); anything else (`invalid_request`, 401, ...) → 503,
 * logged as an error. A refusal never runs the handler. */
export function classifyLedgerError(err: unknown, unavailableRetryAfterS: number): LedgerFailure {
  const configured = Math.max(1, Math.ceil(unavailableRetryAfterS));
  const unavailable = (failOpen: boolean, retryAfter: number, unexpected: boolean): LedgerFailure => ({
    failOpen,
    status: 503,
    code: 'idempotency_unavailable',
    detail: UNAVAILABLE_DETAIL,
    retryAfter,
    unexpected,
  });
  // Retried until the deadline: what the last try got.
  if (err instanceof DeadlineExceeded && err.cause !== undefined) err = err.cause;
  if (err instanceof TransportError || (err instanceof Unavailable && err.status === 503)) return unavailable(true, configured, false);
  if (err instanceof StaleBinding) {
    return { failOpen: false, status: 403, code: 'idempotency_forbidden', detail: FORBIDDEN_DETAIL, retryAfter: null, unexpected: false };
  }
  if (err instanceof ProblemError && err.status === 429) {
    const ra = err.retryAfterS;
    return unavailable(false, ra !== null && Number.isFinite(ra) && ra >= 0 ? Math.max(1, Math.ceil(ra)) : configured, false);
  }
  if (err instanceof RecordRefused) return unavailable(false, configured, false);
  return unavailable(false, configured, true);
}

// ---------------------------------------------------------------------------
// The engine: every SPEC §8 decision for one request, whatever the framework.
// An adapter (express.ts, fastify.ts, fetch.ts) describes the request
// (`CoreRequest`), calls `begin`, and then either runs the handler unwrapped,
// sends the answer it got, or runs the handler under the lease and hands its
// response (`run.respond`) or its failure (`run.fail`) back.
// ---------------------------------------------------------------------------

export interface RoutePolicy {
  /** A request without a key gets 400 (else it runs unwrapped). Default true. */
  required?: boolean;
  /** Ledger unreachable (no answer, or a 503 `unavailable`): run the handler
   * without idempotency (logged) instead of 503. A refusal of the ledger
   * (`stale_binding`, `record_refused`, 429, 401, ...) never runs it. */
  failOpen?: boolean;
  /** The handler counts as failed (unknown) after this many ms. Default: none. */
  timeoutMs?: number | null;
  /** Seconds a duplicate of a request still running waits for its outcome
   * (claiming again after the ledger's retry hint) before it answers 409
   * `request_in_progress`: the outcome, if it arrives, is replayed (default
   * 0: no wait). */
  wait?: number;
  /** Statuses whose responses say nothing happened: not stored, the lease
   * released `not_committed`, the retry runs the handler (default 408, 409,
   * 425, 429). A status added to these (e.g. 422, when the framework
   * answers validation itself) is released with `forget`: the record is
   * removed, so the corrected request with the same key runs. */
  releaseOn?: readonly number[];
}

export interface Logger {
  info(msg: string): void;
  warn(msg: string): void;
  error(msg: string, err?: unknown): void;
}

/** What a principal extractor finds: the caller's account (generation 0),
 * the account with its generation, or null/undefined when the request has
 * no identity (401 `idempotency_principal_missing`). */
export type Principal = string | { principal: string; generation?: number } | null | undefined;

/** The `principal` option: the request → its caller. It must name the
 * caller's account, stable across credential refresh: never a token or a
 * header value (a retry sent after an OAuth refresh must replay). `Req` is
 * the framework's request: Node's IncomingMessage (Express, node:http), a
 * FastifyRequest, or a Fetch API Request. */
export type PrincipalExtractor<Req = IncomingMessage> = (req: Req) => Principal | Promise<Principal>;

/** The response a middleware reconcile hook found: what the first request's
 * handler answered (e.g. rebuilt from the upstream's record). A body that is
 * neither a string nor bytes is sent as JSON (content-type
 * application/json unless given). */
export interface ReconciledResponse {
  status: number;
  headers?: Record<string, string> | ReadonlyArray<readonly [string, string]>;
  body?: string | Uint8Array | unknown;
}

/** The stored response of a replay, as `onReplay` gets it. */
export interface ReplayedResponse {
  status: number;
  /** The stored headers, names in lower case. */
  headers: [string, string][];
  body: Buffer;
}

/** Called on every replay of a stored response (the key was answered
 * before; the handler does not run) with that response and the record's
 * receipt; what it returns (or resolves to) is sent instead, with
 * `Idempotent-Replayed: true` (a body that is neither a string nor bytes
 * is sent as JSON). What it throws goes to the framework as a handler's
 * error would; the record is not touched. */
export type ReplayResponseHook = (response: ReplayedResponse, receipt: Receipt) => ReconciledResponse | Promise<ReconciledResponse>;

/** What a middleware reconcile hook found (SPEC §8): the effect applied,
 * with the response to store and replay; not applied (the handler runs
 * under the same fence); or it cannot tell (409 `outcome_unknown`). */
export type MiddlewareFinding = 'not_committed' | 'unavailable' | { finding: 'committed'; response: ReconciledResponse };

/** What the middleware knows of the retried request, for a reconcile hook. */
export interface ReconcileRequestInfo {
  /** The Idempotency-Key the client sent (unquoted). */
  idempotencyKey: string;
  /** The principal the extractor found (before bindingPrincipal). */
  principal: string;
  /** The request method (upper case). */
  method: string;
  /** The path with its query, as sent. */
  path: string;
  /** The request headers, names in lower case (several field lines joined with ", "). */
  headers: Record<string, string>;
  /** The request body's bytes (the stream itself is left for the handler). */
  body: Buffer;
  /** Aborted when the hook ran past `hookTimeoutMs` (its answer no longer counts). */
  signal: AbortSignal;
}

/** Asked when a retry finds the record `unknown`: the ledger key, the
 * reconcile lease's fence, the retried request (read its headers; do not
 * consume its body, the handler may still need it) and `info` (the key,
 * the principal, the method, path, headers and body's bytes). The lease is
 * heartbeated while it runs; past `hookTimeoutMs` it counts as
 * `unavailable`. */
export type MiddlewareReconcileHook<Req = IncomingMessage> = (
  ledgerKey: string,
  fence: number,
  req: Req,
  info: ReconcileRequestInfo,
) => Promise<MiddlewareFinding> | MiddlewareFinding;

/** The options every adapter takes (Express `idempotency`, Fastify
 * `idempotency` plugin, Fetch `withIdempotency`); `Req` is its request type. */
export interface CoreOptions<Req = IncomingMessage> {
  client: Client;
  /** Required: who the caller is (see `fixedPrincipal`, `authenticatedPrincipal`). */
  principal: PrincipalExtractor<Req>;
  /** Part of every ledger key (default "default"). */
  namespace?: string;
  /** Methods wrapped when `routes` is not given (default POST, PATCH). */
  methods?: string[];
  /** Per-route policy by method and path; null/undefined: not wrapped. */
  routes?: (method: string, path: string) => RoutePolicy | null | undefined;
  /** Headers stored and replayed besides content-type and location. */
  storedHeaders?: string[];
  /** Request headers that are part of the fingerprint. */
  fingerprintHeaders?: string[];
  /** RFC 8785 canonical JSON bodies in the fingerprint, so that key order
   * and whitespace never make a retry a mismatch (default true; false: the
   * raw bytes count). */
  canonicalJson?: boolean;
  /** Only these RFC 6901 pointers of a JSON body count in the fingerprint
   * (the object {pointer: value} of those that resolve). Not with `exclude`. */
  fields?: string[];
  /** These RFC 6901 pointers of a JSON body do not count in the
   * fingerprint (e.g. a client timestamp). Not with `fields`. */
  exclude?: string[];
  /** Responses above this are settled with their digest and not replayed (default 32 KiB). */
  maxStoredBody?: number;
  /** Request bodies above this get 413 (default 1 MiB). */
  maxRequestBody?: number;
  leaseMs?: number;
  retentionS?: number;
  timeoutMs?: number | null;
  failOpen?: boolean;
  /** Seconds a duplicate waits for the running request's outcome (RoutePolicy.wait; default 0). */
  wait?: number;
  /** Statuses released instead of stored (RoutePolicy.releaseOn; default 408, 409, 425, 429). */
  releaseOn?: readonly number[];
  /** How long a claim or dispatch that settle does not answer (no answer,
   * 503, 429) is retried, with the same claim_id, before the request gets
   * 503 `idempotency_unavailable` (default 2000 ms). */
  ledgerDeadlineMs?: number;
  /** The reconcile hook's time limit (default: leaseMs); past it, it counts as `unavailable`. */
  hookTimeoutMs?: number;
  unavailableRetryAfterS?: number;
  /** Resolves a record left unknown when a retry arrives (SPEC §8):
   * `{ finding: 'committed', response }` stores and replays that response,
   * 'not_committed' runs the handler under the same fence, 'unavailable'
   * (or a throw) answers 409 `outcome_unknown`. */
  reconcile?: MiddlewareReconcileHook<Req>;
  /** Called on every replay of a stored response; its answer is sent instead (see ReplayResponseHook). */
  onReplay?: ReplayResponseHook;
  /** Called with every escaped failure (default: console.error). */
  onError?: (err: unknown, req: Req) => void;
  logger?: Logger;
}

const RETRYABLE = Symbol.for('settle.idempotency.retryable');

/** Mark a response as saying nothing happened: not stored, the lease is
 * released with not_committed, and a retry runs the handler again. Takes
 * what the framework answers with (Express/node:http `res`, Fastify
 * `reply`, a Fetch `Response`) and returns it. */
export function markRetryable<T extends object>(res: T): T {
  (res as unknown as Record<symbol, boolean>)[RETRYABLE] = true;
  return res;
}

/** Whether `markRetryable` marked one of these objects. */
export function isMarkedRetryable(...objects: unknown[]): boolean {
  return objects.some((o) => typeof o === 'object' && o !== null && (o as Record<symbol, unknown>)[RETRYABLE] === true);
}

function checkGeneration(g: unknown): number {
  if (typeof g !== 'number' || !Number.isSafeInteger(g) || g < 0) {
    throw new RangeError(`a principal's generation must be an integer in [0, 2^53 - 1], got ${String(g)}`);
  }
  return g;
}

/** The principal and generation an extractor found, or null (no identity). */
export function principalParts(found: Principal): { principal: string; generation: number } | null {
  if (found === null || found === undefined) return null;
  if (typeof found === 'string') return { principal: found, generation: 0 };
  if (typeof found === 'object' && typeof found.principal === 'string') {
    return { principal: found.principal, generation: found.generation === undefined ? 0 : checkGeneration(found.generation) };
  }
  throw new TypeError(`the principal extractor must return a string, { principal, generation? }, null or undefined, not ${String(found)}`);
}

/** The `principal` of an application with one caller: every request is
 * `name` (at `generation`; move it forward after revoking `name`). */
export function fixedPrincipal(name: string, generation = 0): PrincipalExtractor<unknown> {
  if (typeof name !== 'string') throw new TypeError('fixedPrincipal(name): the name must be a string');
  const found = { principal: name, generation: checkGeneration(generation) };
  return () => found;
}

/** The `principal` from the authenticated identity that an earlier
 * middleware or hook put in `req.user` (Passport/Express, @fastify/jwt,
 * @fastify/passport): no `req.user` → null (401
 * `idempotency_principal_missing`). The principal is `pick(user)` when given
 * (a string, `{ principal, generation? }` or null), else
 * `String(user.id ?? user.username)` (null when it has neither). It must
 * name the account, never a token. */
export function authenticatedPrincipal(pick?: (user: any) => Principal | Promise<Principal>): PrincipalExtractor<object> { // eslint-disable-line @typescript-eslint/no-explicit-any
  if (pick !== undefined && typeof pick !== 'function') throw new TypeError('authenticatedPrincipal(pick?): pick must be a function of req.user');
  return (req) => {
    const user = (req as { user?: unknown }).user;
    if (user === null || user === undefined) return null;
    if (pick) return pick(user);
    if (typeof user !== 'object') return null;
    const u = user as { id?: unknown; username?: unknown };
    const id = u.id ?? u.username;
    return id === null || id === undefined ? null : String(id);
  };
}

/** Every field line of the header `name` (lower case) of a Node request, in order. */
export function rawHeaderValues(req: IncomingMessage, name: string): string[] {
  const out: string[] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) if ((raw[i] as string).toLowerCase() === name) out.push(raw[i + 1] as string);
  return out;
}

/** Every header of a Node request as [name in lower case, value], in order. */
export function rawHeaderEntries(req: IncomingMessage): [string, string][] {
  const out: [string, string][] = [];
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) out.push([(raw[i] as string).toLowerCase(), raw[i + 1] as string]);
  return out;
}

/** The path (without the query) and the request target of a raw URL as
 * sent: "/p?" and "/p" are one target, as in ASGI. */
export function pathAndTarget(url: string): { path: string; target: string } {
  const q = url.indexOf('?');
  return { path: q === -1 ? url : url.slice(0, q), target: url.endsWith('?') ? url.slice(0, -1) : url };
}

/** A request as the engine sees it. */
export interface CoreRequest<Req> {
  /** The framework's request: given to the principal extractor, the reconcile hook and onError. */
  req: Req;
  method: string;
  /** The path without its query (route selection). */
  path: string;
  /** The request target: the path with its query, as sent. */
  target: string;
  /** Every field line of a header (the name in lower case); [] when absent. */
  headerValues(name: string): string[];
  /** Every header as [name in lower case, value], for the reconcile hook. */
  headerEntries?(): [string, string][];
  /** The body's bytes ('too_large' past `maxBytes`); called once, after the key and the principal were found. */
  body(maxBytes: number): Promise<Uint8Array | 'too_large'>;
}

/** An answer to send as it is. */
export interface CoreResponse {
  status: number;
  headers: [string, string][];
  body: Buffer;
}

/** A handler running under an execute lease (dispatched, heartbeated). */
export interface CoreRun {
  readonly key: string;
  readonly fence: number;
  readonly timeoutMs: number | null;
  /** The handler answered: settled `completed` (`failed` for a 5xx), or,
   * for a `releaseOn` status or `retryable`, released `not_committed`
   * (with `forget` for a status added to the default ones). Resolves when
   * the ledger knows (or gave up: logged); then send the response. */
  respond(status: number, headers: ReadonlyArray<readonly [string, string]>, body: Uint8Array, retryable?: boolean): Promise<void>;
  /** An escaped failure (a throw, a timeout): settled `unknown`; resolves to
   * the 500 `outcome_unknown` answer. The handler's `EffectNotSent`
   * (nothing was done): released `not_committed`, 503
   * `idempotency_unavailable` with `Retry-After: 1`. */
  fail(err: unknown, timeout: boolean): Promise<CoreResponse>;
}

export type Begun =
  /** Run the handler as without the middleware: the route is not wrapped, a
   * key is optional and absent, or the ledger is unreachable under failOpen. */
  | { kind: 'unwrapped' }
  /** Send this (a problem or a replay); the handler does not run. */
  | { kind: 'answer'; response: CoreResponse }
  /** Run the handler under the lease, then `run.respond` or `run.fail`. */
  | { kind: 'run'; run: CoreRun };

export interface Engine<Req> {
  /** Replays and refusals by kind (SPEC §8: counted). */
  readonly stats: Record<string, number>;
  readonly maxRequestBody: number;
  begin(call: CoreRequest<Req>): Promise<Begun>;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const defaultLogger: Logger = { info: () => {}, warn: (m) => console.warn(m), error: (m, e) => console.error(m, e ?? '') };

/** An answer with a body: content-length set, the given headers (lower case). */
export function answer(status: number, headers: [string, string][], body: Buffer): CoreResponse {
  return { status, headers: [...headers, ['content-length', String(body.length)]], body };
}

/** A problem+json answer. */
export function problemResponse(status: number, code: string, detail: string, extra: [string, string][] = []): CoreResponse {
  return answer(status, [['content-type', 'application/problem+json'], ...extra], problemBody(status, code, detail));
}

function checkReleaseOn(statuses: readonly number[] | undefined, where: string): ReadonlySet<number> | null {
  if (statuses === undefined) return null;
  if (!Array.isArray(statuses) || statuses.some((x) => !Number.isInteger(x) || x < 100 || x > 599)) {
    throw new RangeError(`${where}: releaseOn is an array of HTTP statuses (100-599)`);
  }
  return new Set(statuses);
}

/** The SPEC §8 engine for one adapter (`who` names its factory in errors). */
export function createEngine<Req>(options: CoreOptions<Req>, who = 'idempotency'): Engine<Req> {
  const client = options?.client;
  if (!client) throw new TypeError(`${who}({ client }) needs a settle Client`);
  const extractPrincipal = options.principal;
  if (typeof extractPrincipal !== 'function') {
    throw new TypeError(
      `${who}({ principal }) is required: a function of the request that names the caller's account ` +
        '(never a token or a header value), e.g. principal: fixedPrincipal("acct-1") for an application with one caller, ' +
        'or principal: authenticatedPrincipal() for req.user',
    );
  }
  const unavailableRetryAfterS = options.unavailableRetryAfterS ?? 1;
  const namespace = options.namespace ?? 'default';
  const methods = new Set((options.methods ?? ['POST', 'PATCH']).map((m) => m.toUpperCase()));
  const stored = [...new Set([...DEFAULT_STORED_HEADERS, ...(options.storedHeaders ?? []).map((h) => h.toLowerCase())])];
  const fpHeaders = (options.fingerprintHeaders ?? []).map((h) => h.toLowerCase());
  // Checked here: a bad combination throws MiddlewareConfigError naming the option.
  const fpOptions = fingerprintOptions({ canonicalJson: options.canonicalJson, fields: options.fields, exclude: options.exclude });
  const maxStoredBody = options.maxStoredBody ?? DEFAULT_MAX_STORED_BODY;
  const maxRequestBody = options.maxRequestBody ?? 1024 * 1024;
  const leaseMs = options.leaseMs ?? 30_000;
  const ledgerDeadlineMs = options.ledgerDeadlineMs ?? DEFAULT_LEDGER_DEADLINE_MS;
  if (!(ledgerDeadlineMs >= 0)) throw new RangeError(`${who}({ ledgerDeadlineMs }) must be >= 0`);
  const hookTimeoutMs = options.hookTimeoutMs ?? leaseMs;
  if (!(hookTimeoutMs > 0)) throw new RangeError(`${who}({ hookTimeoutMs }) must be > 0`);
  const log = options.logger ?? defaultLogger;
  const onError = options.onError ?? ((err: unknown) => console.error('idempotency: handler failed', err));
  const checkWait = (w: number | undefined): number => {
    if (w === undefined) return 0;
    if (typeof w !== 'number' || !Number.isFinite(w) || w < 0) throw new RangeError(`the wait option is seconds >= 0, got ${String(w)}`);
    return w;
  };
  const defaultReleaseOn = checkReleaseOn(options.releaseOn, who) ?? NOT_COMMITTED_STATUSES;
  const defaultPolicy: RoutePolicy = {
    required: true,
    failOpen: options.failOpen ?? false,
    timeoutMs: options.timeoutMs ?? null,
    wait: checkWait(options.wait),
    releaseOn: [...defaultReleaseOn],
  };
  const releaseSets = new WeakMap<readonly number[], ReadonlySet<number>>();
  const releaseOnOf = (policy: RoutePolicy): ReadonlySet<number> => {
    const list = policy.releaseOn;
    if (list === undefined) return defaultReleaseOn;
    let set = releaseSets.get(list);
    if (!set) releaseSets.set(list, (set = checkReleaseOn(list, 'routes') ?? defaultReleaseOn));
    return set;
  };
  const stats: Record<string, number> = {};
  const count = (k: string) => {
    stats[k] = (stats[k] ?? 0) + 1;
  };

  function policyOf(method: string, path: string): RoutePolicy | null {
    if (options.routes) {
      const p = options.routes(method, path);
      if (!p) return null;
      return {
        required: p.required ?? true,
        failOpen: p.failOpen ?? false,
        timeoutMs: p.timeoutMs ?? defaultPolicy.timeoutMs ?? null,
        wait: p.wait === undefined ? (defaultPolicy.wait ?? 0) : checkWait(p.wait),
        ...(p.releaseOn !== undefined ? { releaseOn: p.releaseOn } : {}),
      };
    }
    return methods.has(method.toUpperCase()) ? defaultPolicy : null;
  }

  /** The one place the request fingerprint is computed (SPEC §8, MIDDLEWARE-KEYS.md). */
  function fingerprintOf(call: CoreRequest<Req>, method: string, body: Uint8Array): string {
    return requestFingerprint(
      method,
      call.target,
      call.headerValues('content-type')[0] ?? '',
      body,
      fpHeaders.map((h) => [h, call.headerValues(h).join(', ')] as const),
      fpOptions,
    );
  }

  const refuse = (status: number, code: string, detail: string, key: string | null, extra: [string, string][] = []): Begun => {
    count(code);
    log.info(`idempotency: ${code} for key ${key}`);
    return { kind: 'answer', response: problemResponse(status, code, detail, extra) };
  };

  const notStored = (key: string): Begun =>
    refuse(409, 'response_not_stored', 'this request completed but its response was too large to store; it will not run again', key);

  function replay(key: string, result: unknown): Begun {
    const s = decodeResponse(result);
    if (!s || s.body === null) return notStored(key);
    count('replayed');
    log.info(`idempotency: replay of key ${key}`);
    return { kind: 'answer', response: answer(s.status, [...s.headers, ['idempotent-replayed', 'true']], s.body) };
  }

  /** A claim or dispatch that failed (SPEC §8): only a ledger that gave no
   * answer or a 503 `unavailable` lets a failOpen route run the handler; a
   * refusal never does. */
  function ledgerFailed(policy: RoutePolicy, key: string, err: unknown, call: string): Begun {
    const f = classifyLedgerError(err, unavailableRetryAfterS);
    if (policy.failOpen && f.failOpen) {
      count('fail_open');
      log.warn(`idempotency: ledger unreachable (${String(err)}); key ${key} runs WITHOUT idempotency (failOpen)`);
      return { kind: 'unwrapped' };
    }
    count(f.code);
    if (f.unexpected) log.error(`idempotency: unexpected answer of the ledger to the ${call} of key ${key}`, err);
    else log.warn(`idempotency: the ${call} of key ${key} failed (${f.code}): ${String(err)}`);
    return { kind: 'answer', response: problemResponse(f.status, f.code, f.detail, f.retryAfter === null ? [] : [['retry-after', String(f.retryAfter)]]) };
  }

  const inProgress = (key: string, d: InFlight): Begun =>
    refuse(409, 'request_in_progress', 'a request with this Idempotency-Key is still being processed', key, [['retry-after', inProgressRetryAfter(d)]]);

  const unknownAnswer = (): CoreResponse => problemResponse(500, 'outcome_unknown', 'the request failed; its outcome is unknown and must be reconciled');

  /** The deadline of a call that hands the lease back (release, the settle
   * of `unknown`, reconcile(unavailable)): past the ledger deadline, up to
   * the lease's end, so that the record is not left held. */
  const cleanupDeadline = (hb: Heartbeat): Deadline => new Deadline(Math.max(hb.leaseEnd(), Date.now() + ledgerDeadlineMs), true);

  async function begin(call: CoreRequest<Req>): Promise<Begun> {
    const method = call.method.toUpperCase();
    const policy = policyOf(method, call.path);
    if (!policy) return { kind: 'unwrapped' };
    let key: string | null;
    try {
      key = parseIdempotencyKey(call.headerValues('idempotency-key'));
    } catch (e) {
      const k = e as KeyHeaderError;
      return refuse(400, k.code, k.message, null);
    }
    if (key === null) {
      if (!policy.required) return { kind: 'unwrapped' };
      return refuse(400, 'idempotency_key_missing', 'this route requires an Idempotency-Key header', null);
    }
    const who = principalParts(await extractPrincipal(call.req));
    if (who === null) return refuse(401, 'idempotency_principal_missing', PRINCIPAL_MISSING_DETAIL, key);
    const read = await call.body(maxRequestBody);
    if (read === 'too_large') return refuse(413, 'payload_too_large', 'the request body is over the idempotency limit', key);
    const body = Buffer.from(read.buffer, read.byteOffset, read.byteLength);
    const fp = fingerprintOf(call, method, body);
    const { principal, generation } = who;
    const lkey = ledgerKey(namespace, principal, key);
    const binding: Binding = { principal: bindingPrincipal(principal), scopes: [], generation };

    let dec;
    let clock: LeaseClock = { renewedAt: Date.now() };
    let running: InFlight | null = null; // a request with this key is known to be running
    // A duplicate of a request still running waits up to policy.wait
    // seconds for its outcome, claiming again after the ledger's hint.
    const waiting = new Deadline((policy.wait ?? 0) * 1000);
    for (;;) {
      // One claim_id per claim, sent again by its retries (SPEC §4 rule 5a).
      const claimId = newClaimId();
      clock = { renewedAt: Date.now() };
      try {
        dec = await retrying(
          () =>
            client.claim(lkey, fp, binding, {
              leaseMs,
              worker: workerLabel(key, principal),
              marksDispatch: true,
              claimId,
              ...(options.retentionS !== undefined ? { retentionS: options.retentionS } : {}),
            }),
          // While waiting for a request known to be running, one try: a
          // failing claim then answers request_in_progress at once, as in
          // Python and Rust (the client retries later).
          new Deadline(running ? 0 : ledgerDeadlineMs),
          'claim',
        );
      } catch (e) {
        if (e instanceof FingerprintMismatch || e instanceof BindingMismatch) {
          return refuse(422, 'idempotency_key_reused', 'this Idempotency-Key was used for another request', key);
        }
        // Waiting for a request known to be running: never fail open.
        if (running && !(e instanceof StaleBinding)) {
          log.warn(`idempotency: a claim of key ${key} failed while waiting for the running request: ${String(e)}`);
          return inProgress(key, running);
        }
        return ledgerFailed(policy, key, e, 'claim');
      }
      if (dec.decision !== 'in_flight' || waiting.left() <= 0) break;
      running = dec;
      await sleep(Math.min(dec.retryAfterMs, waiting.left()));
    }
    if (dec.decision === 'replay') {
      const s = options.onReplay ? decodeResponse(dec.outcome.result) : null;
      if (!options.onReplay || !s || s.body === null) return replay(key, dec.outcome.result);
      const r = foundResponse(await options.onReplay({ status: s.status, headers: s.headers, body: s.body }, dec.receipt));
      count('replayed');
      log.info(`idempotency: replay of key ${key} (onReplay)`);
      return { kind: 'answer', response: answer(r.status, [...r.headers, ['idempotent-replayed', 'true']], r.body) };
    }
    if (dec.decision === 'in_flight') return inProgress(key, dec);
    let grant: Grant = dec;
    if (grant.decision === 'reconcile') {
      const info: ReconcileRequestInfo = {
        idempotencyKey: key,
        principal,
        method,
        path: call.target,
        headers: headersOf(call),
        body,
        signal: new AbortController().signal, // replaced by askHook's
      };
      const g = await reconcile(call.req, lkey, grant, key, fp, binding, info, clock);
      if (g === null) return refuse(409, 'outcome_unknown', 'an earlier request with this Idempotency-Key failed with an unknown outcome', key);
      if ('kind' in g) return g;
      grant = g;
    }
    // The lease is heartbeated from here until the outcome is recorded.
    const fence = grant.fence;
    const hb = startHeartbeat(client, lkey, fence, leaseMs, new AbortController(), clock);
    try {
      // A dispatch whose answer was lost is retried under the same fence
      // (the ledger answers a repeated dispatch alike).
      await retrying(() => client.dispatch(lkey, fence), new Deadline(ledgerDeadlineMs), 'dispatch');
    } catch (e) {
      const after = await releaseUndispatched(lkey, fence, key, fp, binding, hb, e);
      hb.stop();
      if (after === 'unknown') return { kind: 'answer', response: unknownAnswer() };
      return ledgerFailed(policy, key, e, 'dispatch');
    }
    count('executed');
    return { kind: 'run', run: execution(call.req, policy, key, lkey, fp, binding, fence, hb) };
  }

  /** Hands back a lease whose handler never ran, after a dispatch that
   * failed: `not_dispatched`, and lets the ledger decide (SPEC §11.11):
   * when it recorded the dispatch after all (its answer was lost:
   * `receipt_required`), the record is settled `unknown` (never inferred
   * `not_committed`). */
  async function releaseUndispatched(
    lkey: string,
    fence: number,
    key: string,
    fp: string,
    binding: Binding,
    hb: Heartbeat,
    cause: unknown,
  ): Promise<'released' | 'unknown'> {
    try {
      await retrying(() => client.release(lkey, fence, 'not_dispatched'), cleanupDeadline(hb), 'release');
      return 'released';
    } catch (e) {
      if (!(e instanceof ReceiptRequired)) {
        // The lease lapses; with no dispatch recorded nothing is flagged.
        log.warn(`idempotency: release(not_dispatched) of key ${key} failed: ${String(e)}`);
        return 'released';
      }
    }
    log.warn(`idempotency: the dispatch of key ${key} was recorded although its answers were lost (${String(cause)}); outcome unknown`);
    await settleUnknown(lkey, fence, fp, binding, key, 'the dispatch mark was recorded but its answer never arrived; the handler did not run', hb);
    return 'unknown';
  }

  /** `Retry-After` of request_in_progress: the time the running lease has
   * left, in whole seconds, at least 1 and at least the ledger's hint. */
  function inProgressRetryAfter(d: InFlight): string {
    return String(inProgressRetryAfterS(d.retryAfterMs, d.leaseExpiresAt));
  }

  /** SPEC §8: a retry found the record `unknown` (a reconcile lease).
   * Returns the execute grant under the same fence (not_committed: run the
   * handler), the answer of the found response (settled), or null (409
   * `outcome_unknown`: the record stays unknown). */
  async function reconcile(
    req: Req,
    lkey: string,
    grant: Grant,
    key: string,
    fp: string,
    binding: Binding,
    info: ReconcileRequestInfo,
    clock: LeaseClock,
  ): Promise<Grant | Begun | null> {
    const fence = grant.fence;
    const hb = startHeartbeat(client, lkey, fence, leaseMs, new AbortController(), clock);
    try {
      let finding: MiddlewareFinding = 'unavailable';
      const hook = options.reconcile;
      if (hook) {
        try {
          finding = await askHook((signal) => hook(lkey, fence, req, { ...info, signal }), hookTimeoutMs);
        } catch (e) {
          log.error(`idempotency: reconcile hook failed for key ${key}`, e);
          finding = 'unavailable';
        }
      }
      let found: { status: number; headers: [string, string][]; body: Buffer } | null = null;
      if (typeof finding === 'object' && finding !== null && finding.finding === 'committed') {
        try {
          found = foundResponse(finding.response);
        } catch (e) {
          log.error(`idempotency: the reconcile hook of key ${key} found an invalid response; taken as unavailable`, e);
          finding = 'unavailable';
        }
      } else if (finding !== 'not_committed' && finding !== 'unavailable') {
        log.error(`idempotency: the reconcile hook of key ${key} returned ${JSON.stringify(finding)}; taken as unavailable`);
        finding = 'unavailable';
      }
      try {
        if (found) {
          const { result, responseSha256 } = encodeResponse(found.status, found.headers, found.body, stored, maxStoredBody);
          const status = found.status;
          await retrying(
            () => client.reconcile(lkey, fence, 'committed', { fingerprint: fp, binding, outcome: { status: status >= 500 ? 'failed' : 'completed', result, responseSha256 } }),
            cleanupDeadline(hb),
            'reconcile',
          );
          count('reconciled');
          log.info(`idempotency: key ${key} reconciled: the hook found its response (${status})`);
          if (found.body.length <= maxStoredBody) return replay(key, result);
          // Over the stored-body limit: settled with its digest, answered
          // here as the hook gave it; a later replay is 409 response_not_stored.
          const decoded = decodeResponse(result);
          count('replayed');
          return { kind: 'answer', response: answer(status, [...(decoded?.headers ?? []), ['idempotent-replayed', 'true']], found.body) };
        }
        if (finding === 'not_committed') {
          const ans = await retrying(() => client.reconcile(lkey, fence, 'not_committed'), cleanupDeadline(hb), 'reconcile');
          if ('decision' in ans) {
            log.info(`idempotency: key ${key} reconciled: not committed, the handler runs (fence ${fence})`);
            return ans;
          }
          return null;
        }
        await retrying(() => client.reconcile(lkey, fence, 'unavailable'), cleanupDeadline(hb), 'reconcile');
      } catch (e) {
        // The reconcile lease lapses: the record stays unknown.
        log.warn(`idempotency: reconcile of key ${key} failed: ${String(e)}`);
      }
      return null;
    } finally {
      hb.stop();
    }
  }

  /** The handler's run under the lease: heartbeated until its outcome is recorded. */
  function execution(req: Req, policy: RoutePolicy, key: string, lkey: string, fp: string, binding: Binding, fence: number, hb: Heartbeat): CoreRun {
    let over = false;
    const end = (what: string) => {
      if (over) throw new Error(`idempotency: ${what} after the run of key ${key} was over`);
      over = true;
    };
    const releaseOn = releaseOnOf(policy);
    return {
      key,
      fence,
      timeoutMs: policy.timeoutMs ?? null,
      async respond(status, headers, body, retryable = false) {
        end('respond');
        try {
          if (releaseOn.has(status) || retryable) {
            // A status the application added (e.g. a framework's 422): forget the record.
            const forget = releaseOn.has(status) && !NOT_COMMITTED_STATUSES.has(status);
            await releaseNotCommitted(lkey, fence, fp, binding, key, forget, hb);
            return;
          }
          const { result, responseSha256 } = encodeResponse(status, headers, body, stored, maxStoredBody);
          try {
            await retrying(
              () => client.settle(lkey, fence, fp, binding, { status: status >= 500 ? 'failed' : 'completed', result, responseSha256 }),
              cleanupDeadline(hb),
              'settle',
            );
          } catch (e) {
            // The response goes out anyway (the effect happened); the record
            // becomes unknown when its lease lapses.
            log.error(`idempotency: the response of key ${key} could not be settled`, e);
          }
        } finally {
          hb.stop();
        }
      },
      async fail(err, timeout) {
        end('fail');
        try {
          if (!timeout && err instanceof EffectNotSent) {
            // The handler says nothing was done: released, the retry runs it.
            log.info(`idempotency: the handler of key ${key} raised ${errorName(err)}: released not_committed`);
            if (await releaseNotCommitted(lkey, fence, fp, binding, key, false, hb)) {
              return problemResponse(503, 'idempotency_unavailable', 'the request was not processed; retry it', [['retry-after', '1']]);
            }
            return unknownAnswer();
          }
          await settleUnknown(lkey, fence, fp, binding, key, timeout ? 'timeout' : errorName(err), hb);
          if (!timeout) onError(err, req);
          return unknownAnswer();
        } finally {
          hb.stop();
        }
      },
    };
  }

  /** Releases `not_committed` (with `forget`: the record removed when
   * nothing of it remains); true when released. */
  async function releaseNotCommitted(lkey: string, fence: number, fp: string, binding: Binding, key: string, forget: boolean, hb: Heartbeat): Promise<boolean> {
    count('not_committed');
    const sdl = cleanupDeadline(hb);
    let lost = false; // an answer was lost: a later 404 means the forget was applied
    const once = async () => {
      try {
        return await client.release(lkey, fence, 'not_committed', forget ? { forget: true } : {});
      } catch (e) {
        if (forget && lost && e instanceof NotFound) return null;
        if (e instanceof TransportError) lost = true;
        throw e;
      }
    };
    try {
      await retrying(once, sdl, 'release');
      if (forget) count('forgotten');
      return true;
    } catch (e) {
      if (forget && e instanceof ReceiptRequired) {
        // Something of the record remains (an earlier attempt): keep it.
        return releaseNotCommitted(lkey, fence, fp, binding, key, false, hb);
      }
      if (e instanceof InvalidRequest) {
        // A server without release(not_committed) (SPEC §4): the safe record is unknown.
        log.warn(`idempotency: the ledger refused release(not_committed) for key ${key}; settling unknown`);
        await settleUnknown(lkey, fence, fp, binding, key, 'not_committed unsupported', hb);
      } else {
        log.error(`idempotency: release of key ${key} failed`, e);
      }
      return false;
    }
  }

  async function settleUnknown(lkey: string, fence: number, fp: string, binding: Binding, key: string, why: string, hb: Heartbeat): Promise<void> {
    count('outcome_unknown');
    log.warn(`idempotency: key ${key} failed (${why}); outcome unknown`);
    try {
      await retrying(() => client.settle(lkey, fence, fp, binding, { status: 'unknown', error: `handler failed: ${why}` }), cleanupDeadline(hb), 'settle');
    } catch (e) {
      log.error(`idempotency: settle unknown of key ${key} failed`, e); // the lease lapses after dispatch: unknown anyway
    }
  }

  return { stats, maxRequestBody, begin };
}

/** Every header of the request as one record (names in lower case). */
function headersOf<Req>(call: CoreRequest<Req>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [n, v] of call.headerEntries?.() ?? []) {
    const name = n.toLowerCase();
    out[name] = name in out ? `${out[name]}, ${v}` : v;
  }
  return out;
}

/** The class of what a handler threw, as the logs and the stored
 * `unknown` outcome name it (Python's `type(e).__name__`): an Error's
 * `name` (the SDK's errors set it to their class), else its type. */
export function errorName(err: unknown): string {
  if (err instanceof Error) return err.name && err.name !== 'Error' ? err.name : err.constructor?.name || 'Error';
  return err === null ? 'null' : typeof err;
}

/** A reconcile hook's response as status, headers and body bytes (a body
 * that is neither a string nor bytes as JSON, with its content-type). */
export function foundResponse(r: ReconciledResponse): { status: number; headers: [string, string][]; body: Buffer } {
  if (!r || typeof r !== 'object' || !Number.isInteger(r.status) || r.status < 100 || r.status > 599) {
    throw new TypeError('a committed finding needs response: { status (100-599), headers?, body? }');
  }
  const headers: [string, string][] = (Array.isArray(r.headers) ? r.headers : Object.entries(r.headers ?? {})).map(
    ([n, v]) => [String(n).toLowerCase(), String(v)] as [string, string],
  );
  let body: Buffer;
  if (r.body === undefined || r.body === null) body = Buffer.alloc(0);
  else if (typeof r.body === 'string') body = Buffer.from(r.body, 'utf8');
  else if (r.body instanceof Uint8Array) body = Buffer.from(r.body);
  else {
    body = Buffer.from(JSON.stringify(r.body), 'utf8');
    if (!headers.some(([n]) => n === 'content-type')) headers.push(['content-type', 'application/json']);
  }
  return { status: r.status, headers, body };
}
