/** PEM CA certificate(s): a string or Buffer (a bundle may hold several), or an array of them. */
export type CACertificates = string | Buffer | ReadonlyArray<string | Buffer>;
/** A fetch whose https connections trust `ca` (instead of Node's default roots). */
export declare function fetchTrusting(ca: CACertificates): Promise<typeof fetch>;
/** Validates `ca` when the Client is made: a PEM string or Buffer, or a non-empty array of them. */
export declare function checkCA(ca: unknown): asserts ca is CACertificates;
