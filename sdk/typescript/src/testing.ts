// @settle/client/testing: a real ledger for your tests, with any test
// framework (node:test, vitest, jest: nothing here depends on one).
//
//   import { startSettle } from '@settle/client/testing';
//   const settle = await startSettle();          // `settle serve` on a free port, a temporary data directory
//   const client = settle.client();              // a Client of it
//   ...
//   await settle.stop();                         // or: await using settle = await startSettle();
//
//   import { localLedger } from '@settle/client/testing';
//   const ledger = await localLedger();          // in process, from the @settle/local package
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { accessSync, constants, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createRequire } from 'node:module';
import { delimiter, dirname, isAbsolute, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createInterface } from 'node:readline';
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

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** The settle binary: `bin`, else $SETTLE_BIN, else `settle` on PATH; an error naming both when absent. */
export function settleBinary(bin?: string): string {
  const explicit = bin ?? process.env.SETTLE_BIN;
  if (explicit) {
    if (executable(explicit)) return explicit;
    throw new Error(
      `the settle binary ${JSON.stringify(explicit)} (${bin ? 'the bin option' : 'SETTLE_BIN'}) is not an executable file: ` +
        'build it with `cargo build --release -p settle` and point SETTLE_BIN at target/release/settle, or put `settle` on PATH',
    );
  }
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir || !isAbsolute(dir)) continue;
    const p = join(dir, process.platform === 'win32' ? 'settle.exe' : 'settle');
    if (executable(p)) return p;
  }
  throw new Error(
    'no settle binary: SETTLE_BIN is not set and `settle` is not on PATH. ' +
      'Build it with `cargo build --release -p settle` and set SETTLE_BIN=/path/to/target/release/settle, or put `settle` on PATH',
  );
}

const running = new Set<ChildProcess>();
let exitHook = false;

/** Starts `settle serve` on a free port of 127.0.0.1 with a temporary data
 * directory; resolves once it listens. Stop it with `stop()` (a server left
 * running is killed when the test process exits). */
export async function startSettle(options: StartSettleOptions = {}): Promise<SettleServer> {
  const bin = settleBinary(options.bin);
  const dir = mkdtempSync(join(tmpdir(), 'settle-test-'));
  const args = ['serve', '--data', join(dir, 'data'), '--listen', '127.0.0.1:0'];
  const tenants = options.tenants ? Object.entries(options.tenants) : [];
  if (tenants.length > 0) {
    const cfg = join(dir, 'settle.toml');
    writeFileSync(
      cfg,
      tenants.map(([name, token]) => `[[tenants]]\nname = ${JSON.stringify(name)}\ntoken_sha256 = "${createHash('sha256').update(token).digest('hex')}"\n`).join('\n'),
    );
    args.push('--config', cfg);
  }
  args.push(...(options.args ?? []));
  const proc = spawn(bin, args, {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, SETTLE_LOG: options.log ?? process.env.SETTLE_LOG ?? 'error' },
  });
  running.add(proc);
  if (!exitHook) {
    exitHook = true;
    process.once('exit', () => {
      for (const p of running) p.kill('SIGKILL');
    });
  }
  const cleanup = () => {
    running.delete(proc);
    rmSync(dir, { recursive: true, force: true });
  };
  let url: string;
  try {
    url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`settle did not listen within ${options.startTimeoutMs ?? 30_000} ms`)), options.startTimeoutMs ?? 30_000);
      const rl = createInterface({ input: proc.stdout! });
      rl.once('line', (line) => {
        clearTimeout(timer);
        if (line.startsWith('listening on ')) resolve('http://' + (line.split(' ').pop() as string));
        else reject(new Error(`settle did not start: ${line}`));
      });
      proc.once('error', (e) => {
        clearTimeout(timer);
        reject(new Error(`could not run ${bin}: ${e.message}`, { cause: e }));
      });
      proc.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`settle exited (${signal ?? code}) before listening; its log is above`));
      });
    });
  } catch (e) {
    proc.kill('SIGKILL');
    cleanup();
    throw e;
  }
  proc.stdout!.resume(); // later lines are not read: keep the pipe from filling
  let stopping: Promise<void> | null = null;
  const stop = () => {
    stopping ??= (async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
        await exited;
        clearTimeout(t);
      }
      cleanup();
    })();
    return stopping;
  };
  return {
    url,
    dataDir: dir,
    process: proc,
    client: (o = {}) => new Client({ url, ...o }),
    stop,
    [Symbol.asyncDispose]: stop,
  };
}

/** What `localLedger` resolves to: a Client on an in-process ledger. */
export type LocalLedger = Client & { close(): void | Promise<void>; [Symbol.asyncDispose](): Promise<void> };

export interface LocalLedgerOptions {
  /** A data directory (default: the package's own default, see @settle/local). */
  data?: string;
}

/** A fresh in-process ledger (`new LocalLedger(options)` of the
 * @settle/local package, loaded when first called): a Client that needs no
 * server. Close it with `close()` (or `await using`). Fails with how to
 * install @settle/local when it is missing. */
export async function localLedger(options: LocalLedgerOptions = {}): Promise<LocalLedger> {
  const name = '@settle/local'; // a variable: not a dependency of this package, loaded only here
  type Mod = { LocalLedger?: new (o: LocalLedgerOptions) => LocalLedger; default?: { LocalLedger?: new (o: LocalLedgerOptions) => LocalLedger } };
  const notFound = (e: unknown) => {
    const code = (e as { code?: unknown })?.code;
    return (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') && String((e as Error).message).includes(name);
  };
  let mod: Mod;
  try {
    mod = await import(name);
  } catch (e) {
    if (!notFound(e)) throw e;
    // `npm install ./sdk/typescript` links the folder, and Node resolves
    // from this file's real path, outside the project: look from the
    // project (the working directory) as well.
    let dir: string;
    try {
      dir = dirname(createRequire(join(process.cwd(), 'package.json')).resolve(`${name}/package.json`));
    } catch {
      throw new Error(`localLedger() needs the @settle/local package, which is not installed: npm install ./sdk/typescript-local`, { cause: e });
    }
    mod = await import(pathToFileURL(join(dir, 'index.mjs')).href);
  }
  const Ctor = mod.LocalLedger ?? mod.default?.LocalLedger;
  if (typeof Ctor !== 'function') throw new Error('@settle/local does not export the LocalLedger class');
  const ledger = new Ctor(options);
  if (typeof ledger[Symbol.asyncDispose] !== 'function') {
    Object.defineProperty(ledger, Symbol.asyncDispose, { value: async () => ledger.close() });
  }
  return ledger;
}
