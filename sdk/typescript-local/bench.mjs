// What a runOnce (claim + settle, the effect a no-op, fresh keys, one
// caller) costs from Node, with the baseline its HTTP target is set
// against, measured in the same run (docs/performance.md, "What an SDK
// call costs"):
//
// - local_memory: @settle/local's `new LocalLedger()` (target: >= 20,000 pairs/s);
// - local_disk: `new LocalLedger({ data })`;
// - http: runOnce on a Client to `settle serve` on loopback, against
//   http_raw: the same two requests (the same bodies) sent by the same
//   HTTP client (fetch) to the same server, in alternating rounds
//   (target: within 1.3x).
//
//   node sdk/typescript-local/bench.mjs [--pairs N] [--rounds R]   # JSON on stdout
//
// Each mode runs R rounds of N pairs after a warm-up of 200 and reports
// the median round. Needs the addon built (npm install / npm run build
// here), and the settle binary ($SETTLE_BIN, else settle on PATH).
import { parseArgs } from 'node:util';
import { randomUUID, createHash } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runOnce, fingerprint, newClaimId } from '@settle/client';
import { startSettle } from '@settle/client/testing';
import { LocalLedger } from './index.mjs';

const { values } = parseArgs({ options: { pairs: { type: 'string', default: '3000' }, rounds: { type: 'string', default: '3' } } });
const pairs = Number(values.pairs);
const rounds = Number(values.rounds);
const REQUEST = { amount: 1 };
const RESULT = { ok: true };
const round1 = (x) => Math.round(x * 10) / 10;

async function roundOf(pair) {
  const lat = [];
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < pairs; i++) {
    const t = process.hrtime.bigint();
    await pair(randomUUID());
    lat.push(Number(process.hrtime.bigint() - t) / 1e3);
  }
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  lat.sort((a, b) => a - b);
  return { pairs_per_s: round1(pairs / wall), p50_us: round1(lat[Math.floor(lat.length / 2)]), p99_us: round1(lat[Math.ceil(lat.length * 0.99) - 1]) };
}

function medianRound(rs) {
  const best = [...rs].sort((a, b) => a.pairs_per_s - b.pairs_per_s)[Math.floor(rs.length / 2)];
  return { ...best, rounds_pairs_per_s: rs.map((r) => r.pairs_per_s) };
}

const sdkPair = (client) => (key) => runOnce(client, key, REQUEST, async () => ({ result: RESULT }), { principal: 'bench' });

/** The two requests runOnce sends, with the same bodies, by fetch. */
function rawPair(url) {
  const fp = fingerprint(REQUEST);
  const binding = { principal: 'bench', scopes: [], generation: 0 };
  const outcome = { status: 'completed', result: RESULT, response_sha256: createHash('sha256').update('{"ok":true}').digest('hex') };
  const headers = { 'content-type': 'application/json', accept: 'application/json' };
  return async (key) => {
    const c = await fetch(`${url}/v1/operations/${key}/claim`, { method: 'POST', headers, body: JSON.stringify({ fingerprint: fp, binding, claim_id: newClaimId() }) });
    const { fence } = await c.json();
    const s = await fetch(`${url}/v1/operations/${key}/settle`, { method: 'POST', headers, body: JSON.stringify({ fence, fingerprint: fp, binding, outcome }) });
    if (s.status !== 200) throw new Error(await s.text());
    await s.text();
  };
}

async function measure(pair) {
  for (let i = 0; i < 200; i++) await pair(randomUUID());
  const rs = [];
  for (let i = 0; i < rounds; i++) rs.push(await roundOf(pair));
  return medianRound(rs);
}

const dir = mkdtempSync(join(tmpdir(), 'settle-bench-'));
const modes = {};
try {
  const mem = new LocalLedger();
  modes.local_memory = await measure(sdkPair(mem));
  mem.close();
  const disk = new LocalLedger({ data: join(dir, 'local') });
  modes.local_disk = await measure(sdkPair(disk));
  disk.close();
  const server = await startSettle({ log: 'error' });
  try {
    const sdk = sdkPair(server.client());
    const raw = rawPair(server.url);
    for (let i = 0; i < 200; i++) {
      await sdk(randomUUID());
      await raw(randomUUID());
    }
    const sdkRounds = [];
    const rawRounds = [];
    for (let i = 0; i < rounds; i++) {
      // alternating, so that drift hits both
      rawRounds.push(await roundOf(raw));
      sdkRounds.push(await roundOf(sdk));
    }
    modes.http = medianRound(sdkRounds);
    modes.http_raw = medianRound(rawRounds);
  } finally {
    await server.stop();
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const httpRatio = modes.http_raw.pairs_per_s / modes.http.pairs_per_s;
const out = {
  language: 'node',
  node: process.version,
  pairs,
  rounds,
  modes,
  targets: {
    'local_memory_pairs_per_s>=20000': modes.local_memory.pairs_per_s >= 20000,
    'http_within_1.3x_of_raw': Math.round(httpRatio * 100) / 100 <= 1.3,
  },
  ratios: { 'http_raw/http': Math.round(httpRatio * 100) / 100 },
};
console.log(JSON.stringify(out, null, 2));
