// @settle/local: the settle ledger in process, as a @settle/client Client.
import { Client } from '@settle/client';
export { LedgerClosed } from '@settle/client';

export interface LocalLedgerOptions {
  /** A data directory: the embedded store, durable, locked while open.
   * Omitted: in memory, not durable (receipts say `durable: false`). */
  data?: string;
  /** The embedded log's segment size in bytes, 65 536 to 1 GiB (default
   * 4 MiB: a new directory takes about 8 MB; `settle serve`'s is 64 MiB).
   * Unused in memory. */
  segmentBytes?: number;
  /** Per-request timeout (default 10 000 ms), as for a Client. */
  timeoutMs?: number;
  /** Headers added to every request, as for a Client. */
  headers?: Record<string, string>;
}

/** The settle ledger in this process: a Client (accepted wherever one is)
 * whose calls go straight to the same Rust server code, without a socket
 * or fetch objects: in place in memory, on a thread pool (never the event
 * loop) on a directory. */
export declare class LocalLedger extends Client {
  constructor(options?: LocalLedgerOptions);
  /** Whether receipts survive the process: false in memory, true with `data`. */
  readonly durable: boolean;
  /** A fetch for http://settle.local/... answered by this ledger (every route of the HTTP API). */
  readonly fetch: typeof globalThis.fetch;
  /** Closes the store and releases the directory; later calls fail at
   * once with `LedgerClosed` (never retried). Idempotent. */
  close(): void;
  [Symbol.dispose](): void;
  [Symbol.asyncDispose](): Promise<void>;
}
