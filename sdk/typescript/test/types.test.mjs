// The type tests: test/types-check.ts compiled with the TypeScript compiler
// (strict, as the package's own tsconfig) against the built declarations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

test('types survive makeIdempotent and runOnce (tsc on test/types-check.ts)', () => {
  const file = fileURLToPath(new URL('./types-check.ts', import.meta.url));
  const program = ts.createProgram([file], {
    strict: true,
    noEmit: true,
    target: ts.ScriptTarget.ES2022,
    lib: ['lib.es2022.d.ts'],
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    types: ['node'],
    skipLibCheck: true,
  });
  const diagnostics = ts.getPreEmitDiagnostics(program).map((d) => {
    const where = d.file ? `${d.file.fileName}:${d.file.getLineAndCharacterOfPosition(d.start ?? 0).line + 1}: ` : '';
    return where + ts.flattenDiagnosticMessageText(d.messageText, '\n');
  });
  assert.deepEqual(diagnostics, []);
  // The file does use the directives (a sanity check of the check).
  assert.ok(program.getSourceFile(file).text.split('@ts-expect-error').length > 8);
});
