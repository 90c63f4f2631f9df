// The framework-independent half of the SPEC §8 middleware: header parsing,
// the ledger key, the request fingerprint, the stored-response format and
// the problem answers. The byte layouts are in sdk/MIDDLEWARE-KEYS.md; the
// Python middleware (settle_client/_mw.py) implements the same ones and both
// are tested against sdk/middleware-vectors.json.
import { DeadlineExceeded, ProblemError, RecordRefused, StaleBinding, TransportError, Unavailable } from './errors.js';
import { FingerprintError, canonicalize, parsePointer, selectFields, sha256Hex } from './jcs.js';
export const NOT_COMMITTED_STATUSES = new Set([408, 409, 425, 429]);
export const DEFAULT_STORED_HEADERS = ['content-type', 'location'];
export const DEFAULT_MAX_STORED_BODY = 32 * 1024;
const RESULT_VERSION = 1;
/** The Idempotency-Key header is malformed or sent twice. */
export class KeyHeaderError extends Error {
    code;
    constructor(code, message) {
        super(message);
        this.code = code;
    }
}
function visible(s) {
    if (s.length < 1 || s.length > 255)
        return false;
    for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        if (c < 0x21 || c > 0x7e)
            return false;
    }
    return true;
}
function invalid(message) {
    return new KeyHeaderError('idempotency_key_invalid', message);
}
/** The RFC 8941 sf-string that starts at v[i] (a `"`): its unescaped text
 * and the index after its closing quote. Escapes `\"` and `\\` only;
 * characters 0x20–0x7E. */
function sfString(v, i) {
    let out = '';
    for (i++; i < v.length; i++) {
        const c = v[i];
        if (c === '\\') {
            const n = v[i + 1];
            if (n !== '"' && n !== '\\')
                throw invalid('bad escape in an Idempotency-Key sf-string');
            out += n;
            i++;
        }
        else if (c === '"') {
            return [out, i + 1];
        }
        else {
            const code = c.charCodeAt(0);
            if (code < 0x20 || code > 0x7e)
                throw invalid('bad character in an Idempotency-Key sf-string');
            out += c;
        }
    }
    throw invalid('unterminated sf-string in Idempotency-Key');
}
const badParameter = (what) => invalid(`malformed parameter after the Idempotency-Key sf-string: ${what}`);
const KEY = /[a-z*][a-z0-9_.*-]*/y;
const TOKEN = /[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]*/y;
const NUMBER = /-?[0-9]+(\.[0-9]*)?/y;
const BYTES = /:[A-Za-z0-9+/=]*:/y;
/** The match of the sticky `re` starting exactly at v[i], or null. */
function matchAt(re, v, i) {
    re.lastIndex = i;
    return re.exec(v);
}
/** The index after the RFC 8941 bare item at v[i]: an sf-string, a token,
 * an integer or decimal, a byte sequence or a boolean. */
function bareItemEnd(v, i) {
    const c = v[i];
    if (c === undefined)
        throw badParameter("a value is missing after '='");
    if (c === '"')
        return sfString(v, i)[1];
    if (c === '-' || (c >= '0' && c <= '9')) {
        const m = matchAt(NUMBER, v, i);
        if (!m)
            throw badParameter('a number has at least one digit');
        const [whole, frac] = m[0].replace(/^-/, '').split('.');
        if (frac === undefined ? whole.length > 15 : whole.length > 12 || frac.length < 1 || frac.length > 3) {
            throw badParameter('an integer has 1-15 digits, a decimal 1-12 integer and 1-3 fraction digits');
        }
        return i + m[0].length;
    }
    if (c === ':') {
        const m = matchAt(BYTES, v, i);
        if (!m)
            throw badParameter('a byte sequence is base64 between colons');
        return i + m[0].length;
    }
    if (c === '?') {
        if (v[i + 1] === '0' || v[i + 1] === '1')
            return i + 2;
        throw badParameter('a boolean is ?0 or ?1');
    }
    const m = matchAt(TOKEN, v, i);
    if (!m)
        throw badParameter(`unexpected ${JSON.stringify(c)}`);
    return i + m[0].length;
}
/** Checks that v[i..] is zero or more RFC 8941 parameters (then ignored):
 * `;`, spaces (SP only), a key, optionally `=` and a bare item. */
function skipParameters(v, i) {
    while (i < v.length) {
        if (v[i] !== ';')
            throw invalid('unexpected characters after the Idempotency-Key sf-string');
        i++;
        while (v[i] === ' ')
            i++;
        const k = matchAt(KEY, v, i);
        if (!k)
            throw badParameter("a key is lower-case letters, digits and '_-.*', starting with a letter or '*'");
        i += k[0].length;
        if (v[i] === '=')
            i = bareItemEnd(v, i + 1);
    }
}
/** The key of the Idempotency-Key field lines: null when absent. After
 * trimming spaces and tabs, a value starting with `"` is an RFC 8941
 * sf-string, optionally followed by RFC 8941 parameters (parsed and
 * ignored: `"abc";a=1` is the key `abc`); any other value is the key as it
 * is (`abc;a=1` is the key `abc;a=1`). 1–255 visible ASCII after unquoting;
 * sent twice → idempotency_key_invalid. */
export function parseIdempotencyKey(values) {
    if (values.length === 0)
        return null;
    if (values.length > 1)
        throw invalid('the Idempotency-Key header was sent more than once');
    const v = values[0].replace(/^[ \t]+|[ \t]+$/g, '');
    let key = v;
    if (v.startsWith('"')) {
        const [text, end] = sfString(v, 0);
        skipParameters(v, end);
        key = text;
    }
    if (!visible(key))
        throw invalid('the Idempotency-Key must be 1-255 visible ASCII characters');
    return key;
}
const enc = new TextEncoder();
const utf8 = (s) => enc.encode(s);
/** Each field as a 4-byte big-endian length followed by its bytes. */
export function frame(...fields) {
    const parts = [];
    for (const f of fields) {
        const len = Buffer.alloc(4);
        len.writeUInt32BE(f.length, 0);
        parts.push(len, Buffer.from(f.buffer, f.byteOffset, f.byteLength));
    }
    return Buffer.concat(parts);
}
/** SPEC §8 scope: `mw-` + hex SHA-256 of the framed namespace, principal and
 * (unquoted) header value, all UTF-8. */
export function ledgerKey(namespace, principal, key) {
    return 'mw-' + sha256Hex(frame(utf8(namespace), utf8(principal), utf8(key)));
}
/** `application/json` or any `*+json` media type (parameters and case
 * ignored; spaces and tabs around it trimmed): the bodies the fingerprint
 * reads as JSON. */
export function isJsonMedia(contentType) {
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
    code;
    option;
    constructor(code, option, message) {
        super(message);
        this.name = 'MiddlewareConfigError';
        this.code = code;
        this.option = option;
    }
}
/** The body options of the fingerprint, checked (`fingerprintOptions`). */
export class FingerprintOptions {
    canonicalJson;
    fields;
    exclude;
    /** @internal use fingerprintOptions(), which checks */
    constructor(canonicalJson, fields, exclude) {
        this.canonicalJson = canonicalJson;
        this.fields = fields;
        this.exclude = exclude;
        Object.freeze(this);
    }
}
function pointerList(option, code, pointers) {
    if (!Array.isArray(pointers))
        throw new MiddlewareConfigError(code, option, `${option} must be an array of JSON pointers (RFC 6901)`);
    if (pointers.length === 0)
        throw new MiddlewareConfigError(code, option, `${option} must name at least one JSON pointer`);
    for (const p of pointers) {
        if (typeof p !== 'string')
            throw new MiddlewareConfigError(code, option, `${option}: ${String(p)} is not a JSON pointer string`);
        try {
            parsePointer(p);
        }
        catch (e) {
            throw new MiddlewareConfigError(code, option, `${option}: ${e.message}`);
        }
    }
    return Object.freeze([...pointers]);
}
/** The body options of the fingerprint, checked (sdk/MIDDLEWARE-KEYS.md):
 * `fields` and `exclude` are non-empty arrays of RFC 6901 pointers, not
 * both; `exclude` may not hold `""` (the whole document); either needs
 * `canonicalJson`. Anything else throws MiddlewareConfigError naming the
 * option. */
export function fingerprintOptions(input = {}) {
    if (input instanceof FingerprintOptions)
        return input;
    const canonical = input.canonicalJson ?? true;
    if (typeof canonical !== 'boolean')
        throw new MiddlewareConfigError('invalid_canonical_json', 'canonicalJson', 'canonicalJson must be true or false');
    const { fields, exclude } = input;
    if (fields !== undefined && fields !== null && exclude !== undefined && exclude !== null) {
        throw new MiddlewareConfigError('fields_and_exclude', 'exclude', 'fields and exclude cannot both be given (fields keeps, exclude leaves out)');
    }
    const f = fields === undefined || fields === null ? null : pointerList('fields', 'invalid_fields', fields);
    const x = exclude === undefined || exclude === null ? null : pointerList('exclude', 'invalid_exclude', exclude);
    if (x !== null && x.includes(''))
        throw new MiddlewareConfigError('invalid_exclude', 'exclude', 'exclude cannot hold "" (the whole document)');
    if ((f !== null || x !== null) && !canonical) {
        const option = f !== null ? 'fields' : 'exclude';
        throw new MiddlewareConfigError('canonical_json_off', option, `${option} needs canonicalJson (the body is read as JSON, then canonicalised)`);
    }
    return new FingerprintOptions(canonical, f, x);
}
/** True when `v` nests at most `limit` arrays/objects deep. */
function depthAtMost(v, limit) {
    const stack = [[v, 0]];
    while (stack.length > 0) {
        const [cur, d] = stack.pop();
        if (cur !== null && typeof cur === 'object') {
            if (d + 1 > limit)
                return false;
            for (const c of Array.isArray(cur) ? cur : Object.values(cur))
                stack.push([c, d + 1]);
        }
    }
    return true;
}
const INDEX = /^(0|[1-9][0-9]*)$/;
function comparePaths(a, b) {
    for (let i = 0; i < Math.min(a.length, b.length); i++) {
        const x = a[i];
        const y = b[i];
        if (x === y)
            continue;
        if (typeof x === 'number' && typeof y === 'number')
            return x - y;
        if (typeof x === 'number')
            return -1;
        if (typeof y === 'number')
            return 1;
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
export function excludePointers(value, pointers) {
    const paths = [];
    for (const p of pointers) {
        const tokens = parsePointer(p);
        if (tokens.length === 0)
            throw new FingerprintError('invalid_fields', 'exclude cannot hold "" (the whole document)');
        let cur = value;
        const path = [];
        let found = true;
        for (const t of tokens) {
            if (Array.isArray(cur)) {
                if (!INDEX.test(t) || Number(t) >= cur.length) {
                    found = false;
                    break;
                }
                path.push(Number(t));
                cur = cur[Number(t)];
            }
            else if (cur !== null && typeof cur === 'object' && Object.prototype.hasOwnProperty.call(cur, t)) {
                path.push(t);
                cur = cur[t];
            }
            else {
                found = false;
                break;
            }
        }
        if (found)
            paths.push(path);
    }
    paths.sort((a, b) => comparePaths(b, a)); // descending
    let last = null;
    for (const path of paths) {
        if (last !== null && comparePaths(last, path) === 0)
            continue;
        last = path;
        let parent = value;
        for (const step of path.slice(0, -1))
            parent = parent[step];
        const end = path[path.length - 1];
        if (Array.isArray(parent))
            parent.splice(end, 1);
        else
            delete parent[end];
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
export function fingerprintBody(options, contentType, body) {
    if (!options.canonicalJson || body.length === 0 || !isJsonMedia(contentType))
        return body;
    let value;
    let whole;
    try {
        value = JSON.parse(strictUtf8.decode(body));
        if (!depthAtMost(value, MAX_JSON_DEPTH))
            return body;
        whole = canonicalize(value); // the whole body must be JSON the helper accepts
    }
    catch {
        return body; // not JSON after all: the raw bytes count
    }
    if (options.fields !== null)
        return utf8(canonicalize(selectFields(value, options.fields)));
    if (options.exclude !== null)
        return utf8(canonicalize(excludePointers(value, options.exclude)));
    return utf8(whole);
}
/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body (`fingerprintBody`: by default the RFC 8785 form of a
 * JSON body), then each configured header as name (lower case) and value,
 * sorted by name. `options`: `fingerprintOptions(...)` (checked once), the
 * unchecked `{ canonicalJson, fields, exclude }` (checked on every call), or
 * a boolean for canonicalJson alone (default true). */
export function requestFingerprint(method, target, contentType, body, headers = [], options = true) {
    const opts = fingerprintOptions(typeof options === 'boolean' ? { canonicalJson: options } : options);
    const b = fingerprintBody(opts, contentType, body);
    const parts = [utf8(method.toUpperCase()), utf8(target), utf8(contentType), b];
    const hs = headers.map(([n, v]) => [n.toLowerCase(), v]).sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0));
    for (const [n, v] of hs)
        parts.push(utf8(n), utf8(v));
    return sha256Hex(frame(...parts));
}
/** The claim's binding.principal: the principal when it fits the key syntax, else `sha256:` + its digest. */
export function bindingPrincipal(principal) {
    return visible(principal) ? principal : 'sha256:' + sha256Hex(utf8(principal));
}
/** The claim's `worker` field, for operators. */
export function workerLabel(key, principal) {
    return `idempotency-key=${key} principal=${bindingPrincipal(principal)}`;
}
export function responseSha256(status, body) {
    return sha256Hex(frame(utf8(String(status)), body));
}
/** The settled `result` for a response, and its response_sha256. */
export function encodeResponse(status, headers, body, storedNames, maxBody) {
    // The replay sets its own content-length; framing headers are never stored.
    const names = new Set([...storedNames].map((n) => n.toLowerCase()).filter((n) => n !== 'content-length' && n !== 'transfer-encoding'));
    const kept = headers.filter(([n]) => names.has(n.toLowerCase())).map(([n, v]) => [n.toLowerCase(), v]);
    const result = { v: RESULT_VERSION, status, headers: kept };
    if (body.length <= maxBody) {
        result.body = Buffer.from(body).toString('base64');
    }
    else {
        result.body = null;
        result.body_bytes = body.length;
        result.body_sha256 = sha256Hex(body);
    }
    return { result, responseSha256: responseSha256(status, body) };
}
const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;
/** A stored response, or null when `result` is not one. */
export function decodeResponse(result) {
    if (!result || typeof result !== 'object' || Array.isArray(result))
        return null;
    const r = result;
    if (r.v !== RESULT_VERSION || !Number.isInteger(r.status) || !Array.isArray(r.headers))
        return null;
    const hs = [];
    for (const h of r.headers) {
        if (!Array.isArray(h) || h.length !== 2 || typeof h[0] !== 'string' || typeof h[1] !== 'string')
            return null;
        hs.push([h[0], h[1]]);
    }
    if (r.body === null || r.body === undefined)
        return { status: r.status, headers: hs, body: null };
    if (typeof r.body !== 'string' || !B64.test(r.body))
        return null;
    return { status: r.status, headers: hs, body: Buffer.from(r.body, 'base64') };
}
const TITLES = {
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
export function problemBody(status, code, detail) {
    return Buffer.from(JSON.stringify({ type: `urn:settle:problem:${code}`, title: TITLES[code] ?? code, status, detail, code }));
}
/** Whole seconds, at least 1 (SPEC §8). */
export function retryAfterHeader(retryAfterMs) {
    return String(Math.max(1, Math.ceil(retryAfterMs / 1000)));
}
/** SPEC §8 (amended): the `Retry-After` of `request_in_progress` in whole
 * seconds: the time the running lease has left (ceil of lease_expires_at −
 * now), at least 1, and at least the ledger's `retry_after_ms` hint. */
export function inProgressRetryAfterS(retryAfterMs, leaseExpiresAt, now = Date.now()) {
    let s = Math.max(1, Math.ceil(retryAfterMs / 1000));
    const at = leaseExpiresAt ? Date.parse(leaseExpiresAt) : NaN;
    if (Number.isFinite(at))
        s = Math.max(s, Math.ceil((at - now) / 1000));
    return s;
}
/** SPEC §8's rule for a claim or dispatch that failed, shared by the three
 * SDKs: no answer or 503 `unavailable` → 503 `idempotency_unavailable`
 * (fail-open allowed); `stale_binding` → 403 `idempotency_forbidden`;
 * `record_refused` and any 429 → 503 (a 429's own Retry-After, rounded up,
 * when it sent one); anything else (`invalid_request`, 401, ...) → 503,
 * logged as an error. A refusal never runs the handler. */
export function classifyLedgerError(err, unavailableRetryAfterS) {
    const configured = Math.max(1, Math.ceil(unavailableRetryAfterS));
    const unavailable = (failOpen, retryAfter, unexpected) => ({
        failOpen,
        status: 503,
        code: 'idempotency_unavailable',
        detail: UNAVAILABLE_DETAIL,
        retryAfter,
        unexpected,
    });
    // Retried until the deadline: what the last try got.
    if (err instanceof DeadlineExceeded && err.cause !== undefined)
        err = err.cause;
    if (err instanceof TransportError || (err instanceof Unavailable && err.status === 503))
        return unavailable(true, configured, false);
    if (err instanceof StaleBinding) {
        return { failOpen: false, status: 403, code: 'idempotency_forbidden', detail: FORBIDDEN_DETAIL, retryAfter: null, unexpected: false };
    }
    if (err instanceof ProblemError && err.status === 429) {
        const ra = err.retryAfterS;
        return unavailable(false, ra !== null && Number.isFinite(ra) && ra >= 0 ? Math.max(1, Math.ceil(ra)) : configured, false);
    }
    if (err instanceof RecordRefused)
        return unavailable(false, configured, false);
    return unavailable(false, configured, true);
}
