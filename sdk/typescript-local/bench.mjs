// The cost of one runOnce (claim + settle, the effect a no-op) from Node:
// @settle/local's LocalLedger in memory and on a directory, against
// `settle serve` over HTTP on loopback (the same embedded engine).
//
//   node sdk/typescript-local/bench.mjs [--pairs N] [--concurrency C]   # JSON on stdout
//
// Needs `npm ci` here (it builds the addon), and for the HTTP row the
// binary ($SETTLE_BIN, else settle on PATH). Each mode keeps C runOnce
// calls in flight, N pairs in all on fresh keys, after a warm-up of 50.
import { parseArgs } from 'node:util';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runOnce } from '@settle/client';
import { startSettle } from '@settle/client/testing';
import { LocalLedger } from './index.mjs';

const { values } = parseArgs({ options: { pairs: { type: 'string', default: '2000' }, concurrency: { type: 'string', default: '1' } } });
const pairs = Number(values.pairs);
const conc = Number(values.concurrency);

async function measure(client) {
  const one = async () => {
    const t0 = process.hrtime.bigint();
    await runOnce(client, randomUUID(), { amount: 1 }, async () => ({ result: { ok: true } }), { principal: 'bench' });
    return Number(process.hrtime.bigint() - t0) / 1e3;
  };
  for (let i = 0; i < 50; i++) await one();
  const lat = [];
  let left = pairs;
  const t0 = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: conc }, async () => {
      while (left-- > 0) lat.push(await one());
    }),
  );
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((a, b) => a - b);
  const round = (x) => Math.round(x * 10) / 10;
  return {
    pairs: lat.length,
    concurrency: conc,
    pairs_per_s: round(lat.length / wall),
    p50_us: round(lat[Math.floor(lat.length / 2)]),
    p99_us: round(lat[Math.ceil(lat.length * 0.99) - 1]),
  };
}

const dir = mkdtempSync(join(tmpdir(), 'settle-bench-'));
const out = { language: 'node', node: process.version, modes: {} };
try {
  const mem = new LocalLedger();
  out.modes.local_memory = await measure(mem);
  mem.close();
  const disk = new LocalLedger({ data: join(dir, 'local') });
  out.modes.local_disk = await measure(disk);
  disk.close();
  const server = await startSettle({ log: 'error' });
  try {
    out.modes.http_disk = await measure(server.client());
  } finally {
    await server.stop();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
console.log(JSON.stringify(out, null, 2));
