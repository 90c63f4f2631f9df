/** A value that cannot be canonicalised, or a malformed field list.
 * `code` is `invalid_value` or `invalid_fields` (the shared vectors' `error`). */
export declare class FingerprintError extends Error {
    readonly code: 'invalid_value' | 'invalid_fields';
    constructor(code: 'invalid_value' | 'invalid_fields', message: string);
}
/** The RFC 8785 canonical text of a JSON value. */
export declare function canonicalize(value: unknown): string;
/** The reference tokens of an RFC 6901 pointer (`~1` → `/`, `~0` → `~`);
 * a malformed one throws FingerprintError('invalid_fields'). */
export declare function parsePointer(p: string): string[];
/** The object {pointer: value} of the pointers (RFC 6901) that resolve in
 * `value`. A pointer that does not resolve is left out (absent ≠ null); a
 * malformed pointer or an empty list throws FingerprintError('invalid_fields'). */
export declare function selectFields(value: unknown, fields: readonly string[]): Record<string, unknown>;
/** Lowercase hex SHA-256 of the UTF-8 bytes of a string or buffer. */
export declare function sha256Hex(data: string | Uint8Array): string;
/** SPEC §11.1: hex SHA-256 of the RFC 8785 form of `value`, or of its `fields`. */
export declare function fingerprint(value: unknown, fields?: readonly string[]): string;
/** A fresh `claim_id` (SPEC §4 claim rule 5a): 128 random bits, base64url
 * (22 characters). */
export declare function newClaimId(): string;
