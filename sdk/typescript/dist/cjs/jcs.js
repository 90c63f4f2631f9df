"use strict";
Object.defineProperty(exports, "__esModule", { value: true });
exports.FingerprintError = void 0;
exports.canonicalize = canonicalize;
exports.parsePointer = parsePointer;
exports.selectFields = selectFields;
exports.sha256Hex = sha256Hex;
exports.fingerprint = fingerprint;
exports.newClaimId = newClaimId;
// RFC 8785 (JCS) canonical JSON and the SPEC §11.1 fingerprint.
//
// Members are sorted by UTF-16 code units (Array.prototype.sort's default),
// strings and numbers are written as ECMAScript's JSON.stringify writes them
// (RFC 8785 is defined that way), lone surrogates are refused. Field
// selection by JSON pointers is the SDKs' convention (sdk/MIDDLEWARE-KEYS.md):
// the object {pointer: value} of the pointers that resolve.
const node_crypto_1 = require("node:crypto");
/** A value that cannot be canonicalised, or a malformed field list.
 * `code` is `invalid_value` or `invalid_fields` (the shared vectors' `error`). */
class FingerprintError extends Error {
    code;
    constructor(code, message) {
        super(message);
        this.name = 'FingerprintError';
        this.code = code;
    }
}
exports.FingerprintError = FingerprintError;
function hasLoneSurrogate(s) {
    for (let i = 0; i < s.length; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0xd800 && c <= 0xdbff) {
            const n = i + 1 < s.length ? s.charCodeAt(i + 1) : 0;
            if (n >= 0xdc00 && n <= 0xdfff) {
                i++;
                continue;
            }
            return true;
        }
        if (c >= 0xdc00 && c <= 0xdfff)
            return true;
    }
    return false;
}
function str(s) {
    if (hasLoneSurrogate(s))
        throw new FingerprintError('invalid_value', 'lone surrogate in a string');
    return JSON.stringify(s);
}
function num(n) {
    if (!Number.isFinite(n))
        throw new FingerprintError('invalid_value', 'NaN and Infinity are not JSON');
    return JSON.stringify(n); // ECMAScript Number::toString; -0 → "0"
}
function write(v, out, depth) {
    if (depth > 1000)
        throw new FingerprintError('invalid_value', 'nesting deeper than 1000');
    if (v === null) {
        out.push('null');
        return;
    }
    switch (typeof v) {
        case 'boolean':
            out.push(v ? 'true' : 'false');
            return;
        case 'number':
            out.push(num(v));
            return;
        case 'string':
            out.push(str(v));
            return;
        case 'object':
            break;
        default:
            throw new FingerprintError('invalid_value', `${typeof v} is not a JSON value`);
    }
    const obj = v;
    if (typeof obj.toJSON === 'function') {
        write(obj.toJSON(), out, depth + 1); // Date and friends, as JSON.stringify does
        return;
    }
    if (Array.isArray(v)) {
        out.push('[');
        v.forEach((item, i) => {
            if (i)
                out.push(',');
            write(item, out, depth + 1);
        });
        out.push(']');
        return;
    }
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) {
        // Map, Set, class instances...: JSON.stringify would silently write {}.
        throw new FingerprintError('invalid_value', `${v.constructor?.name ?? 'object'} is not a plain JSON object`);
    }
    const keys = Object.keys(obj)
        .filter((k) => obj[k] !== undefined) // an undefined member is absent, as in JSON.stringify
        .sort();
    out.push('{');
    keys.forEach((k, i) => {
        if (i)
            out.push(',');
        out.push(str(k), ':');
        write(obj[k], out, depth + 1);
    });
    out.push('}');
}
/** The RFC 8785 canonical text of a JSON value. */
function canonicalize(value) {
    const out = [];
    write(value, out, 0);
    return out.join('');
}
/** The reference tokens of an RFC 6901 pointer (`~1` → `/`, `~0` → `~`);
 * a malformed one throws FingerprintError('invalid_fields'). */
function parsePointer(p) {
    if (typeof p !== 'string')
        throw new FingerprintError('invalid_fields', 'a field must be a JSON pointer string');
    if (p === '')
        return [];
    if (!p.startsWith('/'))
        throw new FingerprintError('invalid_fields', `JSON pointer ${JSON.stringify(p)} must start with "/"`);
    return p
        .slice(1)
        .split('/')
        .map((t) => {
        if (/~[^01]|~$/.test(t)) {
            throw new FingerprintError('invalid_fields', `JSON pointer ${JSON.stringify(p)}: "~" must be followed by 0 or 1`);
        }
        return t.replace(/~1/g, '/').replace(/~0/g, '~');
    });
}
const MISSING = Symbol('missing');
function resolve(doc, tokens) {
    let cur = doc;
    for (const t of tokens) {
        if (Array.isArray(cur)) {
            if (!/^(0|[1-9][0-9]*)$/.test(t))
                return MISSING;
            const i = Number(t);
            if (i >= cur.length)
                return MISSING;
            cur = cur[i];
        }
        else if (cur !== null && typeof cur === 'object') {
            if (!Object.prototype.hasOwnProperty.call(cur, t))
                return MISSING;
            cur = cur[t];
            if (cur === undefined)
                return MISSING;
        }
        else {
            return MISSING;
        }
    }
    return cur;
}
/** The object {pointer: value} of the pointers (RFC 6901) that resolve in
 * `value`. A pointer that does not resolve is left out (absent ≠ null); a
 * malformed pointer or an empty list throws FingerprintError('invalid_fields'). */
function selectFields(value, fields) {
    if (!Array.isArray(fields))
        throw new FingerprintError('invalid_fields', 'fields must be an array of JSON pointers');
    if (fields.length === 0)
        throw new FingerprintError('invalid_fields', 'fields must name at least one JSON pointer');
    const parsed = fields.map((p) => [p, parsePointer(p)]);
    const out = {};
    for (const [p, tokens] of parsed) {
        const v = resolve(value, tokens);
        if (v !== MISSING)
            out[p] = v;
    }
    return out;
}
/** Lowercase hex SHA-256 of the UTF-8 bytes of a string or buffer. */
function sha256Hex(data) {
    return (0, node_crypto_1.createHash)('sha256').update(data).digest('hex');
}
/** SPEC §11.1: hex SHA-256 of the RFC 8785 form of `value`, or of its `fields`. */
function fingerprint(value, fields) {
    const target = fields === undefined ? value : selectFields(value, fields);
    return sha256Hex(canonicalize(target));
}
/** A fresh `claim_id` (SPEC §4 claim rule 5a): 128 random bits, base64url
 * (22 characters). */
function newClaimId() {
    // Drawn from a pool filled 4 KiB at a time (as crypto.randomUUID does):
    // one call into the random source per 256 ids, not one per claim.
    if (poolAt + 16 > pool.length) {
        pool = (0, node_crypto_1.randomBytes)(4096);
        poolAt = 0;
    }
    poolAt += 16;
    return pool.toString('base64url', poolAt - 16, poolAt);
}
let pool = Buffer.alloc(0);
let poolAt = 0;
