#!/usr/bin/env node
'use strict';
// The install script of @settle/local (also `npm run build` and `prepack`):
// puts the native addon at settle-local.node in the package root, where
// lib/define.cjs loads it. No npm dependency: only node and cargo.
//
// - In the settle repository (this folder, linked by
//   `npm install ../settle/sdk/typescript-local`, or `npm ci` here): runs
//   `cargo build --release --locked -p settle-node` in the workspace
//   (its target/, the same profile and flags as the Python package's
//   maturin build, so one build serves both, and a second install only
//   checks cargo's fingerprints), then copies the cdylib to
//   settle-local.node. cargo decides what is stale, so a pull is rebuilt.
// - Anywhere else (a tarball of `npm pack`, extracted into node_modules):
//   the settle-local.node it carries is used as it is; nothing is built.
//
// cargo's progress goes to stderr; npm shows it with --foreground-scripts.
// CARGO names the cargo binary (default: cargo on PATH).
const { spawnSync } = require('node:child_process');
const { copyFileSync, existsSync, lstatSync, mkdirSync, renameSync, symlinkSync } = require('node:fs');
const { dirname, join, relative, resolve } = require('node:path');

const root = resolve(__dirname, '..');
const out = join(root, 'settle-local.node');
const workspace = resolve(root, '..', '..');
const inRepo =
  existsSync(join(root, 'Cargo.toml')) &&
  existsSync(join(root, 'src', 'lib.rs')) &&
  existsSync(join(workspace, 'Cargo.toml')) &&
  existsSync(join(workspace, 'sdk', 'typescript', 'package.json')) &&
  existsSync(join(workspace, 'crates', 'settle-local', 'Cargo.toml'));

function fail(msg) {
  process.stderr.write(`@settle/local: ${msg}\n`);
  process.exit(1);
}

if (!inRepo) {
  if (existsSync(out)) {
    process.stderr.write('@settle/local: using the prebuilt settle-local.node of this package\n');
    process.exit(0);
  }
  fail(
    `${out} is missing and this is not the settle repository's sdk/typescript-local, so it cannot be built here. ` +
      'Install from the repository folder (npm install ../settle/sdk/typescript ../settle/sdk/typescript-local), ' +
      'or a tarball made there with `npm pack` (it carries the built addon).',
  );
}

// Node resolves a linked package's require('@settle/client') from the
// link's real path (this folder), and npm installs nothing into a linked
// folder: give it the sibling sdk/typescript, as `npm ci` here would (the
// devDependency file:../typescript). The consumer's own @settle/client is
// the same folder, so both load one module and `instanceof Client` holds.
const client = join(root, 'node_modules', '@settle', 'client');
let hasClient = false;
try {
  lstatSync(client);
  hasClient = true;
} catch {}
if (!hasClient) {
  mkdirSync(dirname(client), { recursive: true });
  symlinkSync(relative(dirname(client), join(workspace, 'sdk', 'typescript')), client, 'junction');
}

const cargo = process.env.CARGO || 'cargo';
const args = ['build', '--release', '--locked', '-p', 'settle-node', '--message-format=json-render-diagnostics'];
process.stderr.write(`@settle/local: ${cargo} ${args.slice(0, 5).join(' ')} (in ${workspace})\n`);
const t0 = Date.now();
const r = spawnSync(cargo, args, {
  cwd: workspace,
  stdio: ['ignore', 'pipe', 'inherit'],
  maxBuffer: 256 * 1024 * 1024,
  encoding: 'utf8',
});
if (r.error) {
  fail(
    r.error.code === 'ENOENT'
      ? `building the addon needs the Rust toolchain: ${cargo} was not found (https://rustup.rs, or set CARGO)`
      : `running ${cargo}: ${r.error.message}`,
  );
}
if (r.status !== 0) fail(`${cargo} build failed (exit ${r.status ?? r.signal}); its messages are above`);

// The cdylib's path, as cargo reports it (whatever CARGO_TARGET_DIR is).
let lib;
for (const line of r.stdout.split('\n')) {
  if (!line.startsWith('{')) continue;
  const m = JSON.parse(line);
  if (m.reason === 'compiler-artifact' && m.target && m.target.name === 'settle_node' && m.target.kind.includes('cdylib')) {
    lib = m.filenames.find((f) => /\.(so|dylib|dll)$/.test(f));
  }
}
if (!lib) fail(`${cargo} did not report the settle_node library`);
// Copy, then rename over: a process that has the old file loaded keeps it.
// Two installs at once (npm pack beside a test's npm install) each use
// their own temporary name.
const tmp = `${out}.${process.pid}.tmp`;
copyFileSync(lib, tmp);
renameSync(tmp, out);
process.stderr.write(`@settle/local: built ${out} in ${((Date.now() - t0) / 1000).toFixed(1)} s\n`);
