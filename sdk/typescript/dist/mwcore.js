// The framework-independent half of the SPEC §8 middleware: header parsing,
// the ledger key, the request fingerprint, the stored-response format and
// the problem answers. The byte layouts are in sdk/MIDDLEWARE-KEYS.md; the
// Python middleware (settle_client/_mw.py) implements the same ones and both
// are tested against sdk/middleware-vectors.json.
import { DeadlineExceeded, ProblemError, RecordRefused, StaleBinding, TransportError, Unavailable } from './errors.js';
import { canonicalize, sha256Hex } from './jcs.js';
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
function isJsonMedia(contentType) {
    const media = (contentType.split(';', 1)[0] ?? '').trim().toLowerCase();
    return media === 'application/json' || media.endsWith('+json');
}
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
/** SPEC §8 fingerprint: SHA-256 over the framed method (upper case), the
 * request target (path with its query, as sent), the content-type ("" when
 * absent), the body bytes, then each configured header as name (lower case)
 * and value, sorted by name. With canonicalJson, a body of a JSON media
 * type that parses is replaced by its RFC 8785 form. */
export function requestFingerprint(method, target, contentType, body, headers = [], canonicalJson = false) {
    let b = body;
    if (canonicalJson && body.length > 0 && isJsonMedia(contentType)) {
        try {
            b = utf8(canonicalize(JSON.parse(strictUtf8.decode(body))));
        }
        catch {
            // not JSON after all: the raw bytes count
        }
    }
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
