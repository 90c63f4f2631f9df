// Test helpers: a real `settle serve` per test file (auth off, or with
// tenants), started on a free port with a temporary data directory.
import { spawn } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { createServer } from 'node:net';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');

export function settleBin() {
  const b = process.env.SETTLE_BIN || join(REPO, 'target/release/settle');
  if (!existsSync(b)) throw new Error(`settle binary not found at ${b}: cargo build --release -p settle, or set SETTLE_BIN`);
  return b;
}

export const TOKENS = { alpha: 'token-alpha-0123456789', beta: 'token-beta-9876543210' };

/** Spawns a process and resolves with the address of its "listening on ADDR" line. */
export function spawnListening(cmd, args, env = {}) {
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ...env } });
  return new Promise((res, rej) => {
    const rl = createInterface({ input: proc.stdout });
    rl.once('line', (line) => {
      if (!line.startsWith('listening on ')) {
        proc.kill('SIGKILL');
        rej(new Error(`did not start: ${line}`));
        return;
      }
      res({ url: 'http://' + line.split(' ').pop(), proc });
    });
    proc.once('exit', (code) => rej(new Error(`${cmd} exited with ${code} before listening`)));
  });
}

export async function stop(proc) {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once('exit', r));
  proc.kill('SIGTERM');
  const t = setTimeout(() => proc.kill('SIGKILL'), 10_000);
  await exited;
  clearTimeout(t);
}

// SETTLE_TEST_LEDGER=local: startSettle() gives each test file an in-process
// ledger of @settle/local (sdk/typescript-local, built by its `npm install`)
// on a temporary data directory, as the server would have, instead of a server. Its URL is http://settle-N.local, answered through the
// global fetch, which every Client here uses unless a test passes its own
// (those call the global one in turn). Tests that need a server process —
// tenants, other flags, or a URL for a child process (`remote: true`) —
// still get one; example apps get `--local DIR` instead (ledgerArgs).
export const LOCAL = process.env.SETTLE_TEST_LEDGER === 'local';
const locals = new Map();
let realFetch;

async function startLocal() {
  const { LocalLedger } = await import(pathToFileURL(join(REPO, 'sdk/typescript-local/index.mjs')).href);
  const dir = mkdtempSync(join(tmpdir(), 'settle-ts-local-'));
  const ledger = new LocalLedger({ data: join(dir, 'data') });
  const host = `settle-${locals.size + 1}.local`;
  locals.set(host, ledger);
  if (!realFetch) {
    realFetch = globalThis.fetch;
    globalThis.fetch = (input, init) => {
      const url = new URL(typeof input === 'string' || input instanceof URL ? String(input) : input.url);
      const local = locals.get(url.host);
      if (!local) return realFetch(input, init);
      url.host = 'settle.local';
      return local.fetch(input instanceof Request ? new Request(url, input) : url, init);
    };
  }
  const cleanups = [];
  return {
    url: `http://${host}`,
    proc: null,
    ledger,
    cleanups,
    async close() {
      ledger.close();
      rmSync(dir, { recursive: true, force: true });
      for (const c of cleanups) c();
    },
  };
}

/** The ledger arguments of an example app for `server`: --settle-url, or for
 * a local ledger --local with a fresh directory of the example's own (it
 * runs in another process). */
export function ledgerArgs(server) {
  if (!server.ledger) return ['--settle-url', server.url];
  const dir = mkdtempSync(join(tmpdir(), 'settle-ts-example-'));
  server.cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return ['--local', join(dir, 'data')];
}

export async function startSettle({ auth = false, args: extra = [], remote = false } = {}) {
  if (LOCAL && !auth && extra.length === 0 && !remote) return startLocal();
  const dir = mkdtempSync(join(tmpdir(), 'settle-ts-'));
  const args = ['serve', '--data', join(dir, 'data'), '--listen', '127.0.0.1:0', ...extra];
  if (auth) {
    const cfg = join(dir, 'settle.toml');
    writeFileSync(
      cfg,
      Object.entries(TOKENS)
        .map(([n, t]) => `[[tenants]]\nname = "${n}"\ntoken_sha256 = "${createHash('sha256').update(t).digest('hex')}"\n`)
        .join('\n'),
    );
    args.push('--config', cfg);
  }
  const s = await spawnListening(settleBin(), args, { SETTLE_LOG: process.env.SETTLE_LOG || 'error' });
  return {
    url: s.url,
    proc: s.proc,
    async close() {
      await stop(s.proc);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const newKey = (p = 'k') => `${p}-${randomUUID()}`;

/** A port with nothing listening on it. */
export async function deadUrl() {
  const srv = createServer();
  await new Promise((r) => srv.listen(0, '127.0.0.1', r));
  const port = srv.address().port;
  await new Promise((r) => srv.close(r));
  return `http://127.0.0.1:${port}`;
}

/** Whether the server accepts release(reason="not_committed") (SPEC §4,
 * issue 10 item 0). Tests that need it are skipped ONLY when the server
 * answers 422 for that reason. */
export async function notCommittedSupported(client) {
  const { fingerprint, InvalidRequest } = await import('@settle/client');
  const key = newKey('probe');
  const g = await client.claim(key, fingerprint({ probe: 1 }), { principal: 'probe' }, { marksDispatch: true });
  await client.dispatch(key, g.fence);
  try {
    await client.release(key, g.fence, 'not_committed');
    return true;
  } catch (e) {
    if (e instanceof InvalidRequest && e.field === 'reason') return false;
    throw e;
  }
}

export const NOT_COMMITTED_MISSING =
  'server lacks release(reason="not_committed") (SPEC §4, issue 10 item 0): it answers 422 invalid_request for that reason, so the SDK falls back to settle unknown';
