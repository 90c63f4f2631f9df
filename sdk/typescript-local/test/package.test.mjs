// The install command of the docs, as another project runs it:
// `npm install ./sdk/typescript ./sdk/typescript-local` into a temporary
// project (npm links the folders; the install script builds the addon),
// then require() and import of @settle/local, @settle/client/testing's
// localLedger(), and TypeScript seeing a LocalLedger as a Client.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

const SDK = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
let dir;
const node = (args) => execFileSync(process.execPath, args, { cwd: dir, encoding: 'utf8' });

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'settle-local-pkg-'));
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'consumer', version: '1.0.0', private: true }));
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', join(SDK, 'typescript'), join(SDK, 'typescript-local')], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
});
after(() => rmSync(dir, { recursive: true, force: true }));

test('require(): a LocalLedger that is a Client of @settle/client', () => {
  const out = node(['-e', `
    const { LocalLedger } = require('@settle/local');
    const { Client } = require('@settle/client');
    const l = new LocalLedger();
    console.log(JSON.stringify({ client: l instanceof Client, durable: l.durable }));
    l.close();`]);
  assert.deepEqual(JSON.parse(out), { client: true, durable: false });
});

test('import, runOnce through it, and localLedger() of @settle/client/testing', () => {
  const out = node(['--input-type=module', '-e', `
    import { LocalLedger } from '@settle/local';
    import { Client, runOnce } from '@settle/client';
    import { localLedger } from '@settle/client/testing';
    const l = new LocalLedger();
    const r = await runOnce(l, 'k1', { a: 1 }, async () => ({ result: { ok: true } }), { principal: 'p' });
    const again = await runOnce(l, 'k1', { a: 1 }, async () => ({ result: { ok: false } }), { principal: 'p' });
    l.close();
    const t = await localLedger();
    const t1 = await runOnce(t, 'k1', { a: 2 }, async () => ({ result: 2 }), { principal: 'p' });
    await t[Symbol.asyncDispose]();
    console.log(JSON.stringify({ client: l instanceof Client, first: r.replayed, again: again.replayed, result: again.result,
      testing: t instanceof LocalLedger, fresh: t1.replayed, durable: t1.receipt.durable }));`]);
  assert.deepEqual(JSON.parse(out), { client: true, first: false, again: true, result: { ok: true }, testing: true, fresh: false, durable: false });
});

test('types: a LocalLedger is accepted where a Client is (tsc, module node16)', () => {
  const ts = createRequire(join(SDK, 'typescript/package.json'))('typescript');
  const file = join(dir, 'use.mts');
  writeFileSync(file, `
    import { LocalLedger } from '@settle/local';
    import { Client, runOnce } from '@settle/client';
    const l = new LocalLedger({ data: '/tmp/x' });
    export const c: Client = l;
    export const d: boolean = l.durable;
    export const r = runOnce(l, 'k', {}, async () => ({ result: 1 }), { principal: 'p' });
    // @ts-expect-error data is a path
    new LocalLedger({ data: 1 });
  `);
  const program = ts.createProgram([file], { module: ts.ModuleKind.Node16, moduleResolution: ts.ModuleResolutionKind.Node16, strict: true, noEmit: true, types: ['node'], typeRoots: [join(SDK, 'typescript/node_modules/@types')] });
  const diags = ts.getPreEmitDiagnostics(program).map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n'));
  assert.deepEqual(diags, []);
});
