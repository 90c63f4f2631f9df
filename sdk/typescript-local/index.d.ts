// @settle/local: the settle ledger in process, as a @settle/client Client.
import { Client } from '@settle/client';

export interface LocalLedgerOptions {
  /** A data directory: the embedded store, durable, locked while open.
   * Omitted: in memory, not durable (receipts say `durable: false`). */
  data?: string;
  /** Per-request timeout (default 10 000 ms), as for a Client. */
  timeoutMs?: number;
  /** Headers added to every request, as for a Client. */
  headers?: Record<string, string>;
}

/** The settle ledger in this process: a Client (accepted wherever one is)
 * whose requests are answered by the same Rust server code, on a thread
 * pool (never the event loop), without a socket. */
export declare class LocalLedger extends Client {
  constructor(options?: LocalLedgerOptions);
  /** Whether receipts survive the process: false in memory, true with `data`. */
  readonly durable: boolean;
  /** A fetch for http://settle.local/... answered by this ledger (every route of the HTTP API). */
  readonly fetch: typeof globalThis.fetch;
  /** Closes the store and releases the directory; later calls fail. Idempotent. */
  close(): void;
  [Symbol.dispose](): void;
  [Symbol.asyncDispose](): Promise<void>;
}
