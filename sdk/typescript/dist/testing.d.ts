import { type ChildProcess } from 'node:child_process';
import { Client, type ClientOptions } from './client.js';
export interface StartSettleOptions {
    /** The settle binary (default: $SETTLE_BIN, else `settle` on PATH). */
    bin?: string;
    /** Tenants by name → bearer token: authentication on (default: off). */
    tenants?: Record<string, string>;
    /** More arguments of `settle serve` (after --data, --listen and --config). */
    args?: string[];
    /** The server's log filter, SETTLE_LOG (default: $SETTLE_LOG, else "error"). */
    log?: string;
    /** How long the server may take to listen (default 30 000 ms). */
    startTimeoutMs?: number;
}
export interface SettleServer {
    /** The server's base URL, e.g. http://127.0.0.1:41234 */
    readonly url: string;
    /** The temporary data directory (removed by stop()). */
    readonly dataDir: string;
    /** The server process. */
    readonly process: ChildProcess;
    /** A Client of this server; `token` for a tenant when `tenants` was given. */
    client(options?: Partial<ClientOptions>): Client;
    /** Stops the server (SIGTERM, then SIGKILL after 10 s) and removes its data directory. Safe to call twice. */
    stop(): Promise<void>;
    /** `await using settle = await startSettle()`: stop() at the end of the scope. */
    [Symbol.asyncDispose](): Promise<void>;
}
/** The settle binary: `bin`, else $SETTLE_BIN, else `settle` on PATH; an error naming both when absent. */
export declare function settleBinary(bin?: string): string;
/** Starts `settle serve` on a free port of 127.0.0.1 with a temporary data
 * directory; resolves once it listens. Stop it with `stop()` (a server left
 * running is killed when the test process exits). */
export declare function startSettle(options?: StartSettleOptions): Promise<SettleServer>;
/** What `localLedger` resolves to: a Client on an in-process ledger. */
export type LocalLedger = Client & {
    close(): void | Promise<void>;
    [Symbol.asyncDispose](): Promise<void>;
};
export interface LocalLedgerOptions {
    /** A data directory (default: the package's own default, see @settle/local). */
    data?: string;
}
/** A fresh in-process ledger (`new LocalLedger(options)` of the
 * @settle/local package, loaded when first called): a Client that needs no
 * server. Close it with `close()` (or `await using`). Fails with how to
 * install @settle/local when it is missing. */
export declare function localLedger(options?: LocalLedgerOptions): Promise<LocalLedger>;
