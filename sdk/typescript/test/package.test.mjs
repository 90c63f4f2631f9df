// The package as another project installs it: `npm pack`, installed from
// the tarball into a temporary project; require() gets CommonJS, import()
// ES modules, for the root and every subpath, and TypeScript finds the
// declarations of each (module node16, from a .cts and an .mts file).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const PKG = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const SUBPATHS = ['@settle/client', '@settle/client/fastify', '@settle/client/testing'];
let dir;

const npm = (args, cwd) => execFileSync('npm', args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const node = (args, cwd) => execFileSync(process.execPath, args, { cwd, encoding: 'utf8' });

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'settle-pkg-'));
  npm(['pack', '--silent', '--pack-destination', dir], PKG);
  const tarball = readdirSync(dir).find((f) => f.endsWith('.tgz'));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'consumer', version: '1.0.0', private: true }));
  npm(['install', '--no-audit', '--no-fund', '--offline', '--ignore-scripts', join(dir, tarball)], dir);
});
after(() => rmSync(dir, { recursive: true, force: true }));

const SCRIPT = (load) => `
  const names = ${JSON.stringify(SUBPATHS)};
  const out = {};
  for (const n of names) {
    const m = ${load};
    out[n] = Object.keys(m).filter((k) => k !== 'default' && k !== '__esModule').sort();
  }
  const root = ${load.replace(/\bn\b/g, "'@settle/client'")};
  out.fingerprint = root.fingerprint({ b: [1, 2], a: 'x' });
  const t = ${load.replace(/\bn\b/g, "'@settle/client/testing'")};
  out.local = await t.localLedger().then(() => 'installed', (e) => e.message);
  console.log(JSON.stringify(out));
`;

test('require() and import() of the root and every subpath, from a project that installed the tarball', () => {
  const cjs = JSON.parse(node(['-e', `(async () => { ${SCRIPT('require(n)')} })()`], dir));
  const esm = JSON.parse(node(['--input-type=module', '-e', SCRIPT('await import(n)')], dir));
  assert.deepEqual(cjs, esm, 'the same names and answers in both formats');
  assert.ok(esm['@settle/client'].includes('Client') && esm['@settle/client'].includes('withIdempotency') && esm['@settle/client'].includes('idempotency'));
  assert.deepEqual(esm['@settle/client/fastify'], ['authenticatedPrincipal', 'fixedPrincipal', 'idempotency', 'markRetryable']);
  assert.deepEqual(esm['@settle/client/testing'], ['localLedger', 'settleBinary', 'startSettle']);
  assert.equal(esm.fingerprint.length, 64);
  assert.match(esm.local, /npm install \.\/sdk\/typescript-local/);
  // Which file each condition picked: CommonJS from dist/cjs/, ES modules from dist/.
  const where = JSON.parse(node(['-e', `console.log(JSON.stringify(${JSON.stringify(SUBPATHS)}.map((n) => require.resolve(n))))`], dir));
  assert.ok(where.every((f) => f.includes(`${join('dist', 'cjs')}`)), where.join(' '));
  const whereEsm = JSON.parse(node(['--input-type=module', '-e', `console.log(JSON.stringify(${JSON.stringify(SUBPATHS)}.map((n) => import.meta.resolve(n))))`], dir));
  assert.ok(whereEsm.every((f) => f.includes('/dist/') && !f.includes('/dist/cjs/')), whereEsm.join(' '));
});

test('TypeScript (node16) resolves the declarations of each condition, and they type-check', () => {
  const body = `
import { Client, withIdempotency, type RunResult } from '@settle/client';
import { idempotency, fixedPrincipal } from '@settle/client/fastify';
import { startSettle, localLedger, type SettleServer } from '@settle/client/testing';
export const c: Client = new Client({ url: 'http://127.0.0.1:1' });
export const h = withIdempotency(async (r: Request) => new Response(r.url), { client: c, principal: fixedPrincipal('a') });
export const p = idempotency({ client: c, principal: fixedPrincipal('a') });
export const s: Promise<SettleServer> = startSettle();
export const l = localLedger;
export type R = RunResult<number>;
`;
  writeFileSync(join(dir, 'check.cts'), body);
  writeFileSync(join(dir, 'check.mts'), body);
  const options = {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    lib: ['lib.es2022.d.ts'],
    module: ts.ModuleKind.Node16,
    moduleResolution: ts.ModuleResolutionKind.Node16,
    typeRoots: [join(PKG, 'node_modules/@types')],
    types: ['node'],
    skipLibCheck: true, // fastify itself is not installed in the consumer
  };
  const files = [join(dir, 'check.cts'), join(dir, 'check.mts')];
  const program = ts.createProgram(files, options);
  const diagnostics = ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepEqual(diagnostics, []);
  const host = ts.createCompilerHost(options);
  for (const [file, mode, folder] of [[files[0], ts.ModuleKind.CommonJS, 'dist/cjs/'], [files[1], ts.ModuleKind.ESNext, 'dist/']]) {
    for (const [name, base] of [['@settle/client', 'index'], ['@settle/client/fastify', 'fastify'], ['@settle/client/testing', 'testing']]) {
      const r = ts.resolveModuleName(name, file, options, host, undefined, undefined, mode).resolvedModule;
      assert.ok(r?.resolvedFileName.endsWith(`node_modules/@settle/client/${folder}${base}.d.ts`), `${name} from ${file}: ${r?.resolvedFileName}`);
    }
  }
});

test('a strict project compiles against the declarations with @types/node and no DOM (README: TypeScript projects in strict mode)', () => {
  const body = `
import { Client, makeIdempotent, type EffectContext, type Receipt } from '@settle/client';
import { startSettle } from '@settle/client/testing';
const c = new Client({ url: 'http://127.0.0.1:1' });
export const f = makeIdempotent(async (n: number, _ctx: EffectContext) => n + 1, {
  client: () => c, key: (n) => String(n), principal: 'p', onReplay: (o, r: Receipt) => (o.result as number) + r.fence,
});
export const s = startSettle;
`;
  const file = join(dir, 'strict.mts');
  writeFileSync(file, body);
  const check = (extra) => {
    const options = {
      strict: true,
      noEmit: true,
      skipLibCheck: false,
      target: ts.ScriptTarget.ES2020,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      ...extra,
    };
    return ts.getPreEmitDiagnostics(ts.createProgram([file], options)).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  };
  // @types/node as the consumer installs it (here: this package's own copy).
  assert.deepEqual(check({ lib: ['lib.es2020.d.ts'], typeRoots: [join(PKG, 'node_modules/@types')], types: ['node'] }), []);
  // Without Node's types (the consumer installed none): the README's error.
  const without = check({ lib: ['lib.es2022.d.ts', 'lib.dom.d.ts'], types: [] });
  assert.ok(without.some((m) => m.includes("Cannot find name 'Buffer'")), without.join('\n'));
});
