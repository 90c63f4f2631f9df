// Builds dist/ (or the folder given as the first argument) from src/*.ts:
//   <out>/*.js, *.d.ts       ES modules (the package is "type": "module");
//   <out>/cjs/*.js, *.d.ts   the same as CommonJS, with <out>/cjs/package.json
//                            {"type": "commonjs"} so that Node and TypeScript
//                            read them as such.
// The CommonJS build compiles a copy of src/ in a folder whose package.json
// says "commonjs", with module "node16": TypeScript then emits require()
// for static imports and keeps import() for the dynamic ones (the optional
// @settle/local of testing.ts may be an ES module). sdk/test.sh builds into
// a temporary folder and checks that dist/ is the same.
import { execFileSync } from 'node:child_process';
import { cpSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkg = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const out = resolve(process.argv[2] ?? join(pkg, 'dist'));
const tsc = join(pkg, 'node_modules/typescript/bin/tsc');
const run = (...args) => execFileSync(process.execPath, [tsc, ...args], { cwd: pkg, stdio: 'inherit' });

rmSync(out, { recursive: true, force: true });
run('-p', join(pkg, 'tsconfig.json'), '--outDir', out);

const stage = join(pkg, '.build-cjs');
rmSync(stage, { recursive: true, force: true });
try {
  mkdirSync(stage);
  cpSync(join(pkg, 'src'), join(stage, 'src'), { recursive: true });
  writeFileSync(join(stage, 'package.json'), '{ "type": "commonjs" }\n');
  writeFileSync(
    join(stage, 'tsconfig.json'),
    JSON.stringify({ extends: '../tsconfig.json', compilerOptions: { module: 'node16', moduleResolution: 'node16', rootDir: 'src', outDir: join(out, 'cjs') }, include: ['src'] }),
  );
  run('-p', join(stage, 'tsconfig.json'));
} finally {
  rmSync(stage, { recursive: true, force: true });
}
writeFileSync(join(out, 'cjs', 'package.json'), '{ "type": "commonjs" }\n');
