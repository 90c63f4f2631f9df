#!/usr/bin/env bash
# The SDK checks, against a real settle binary:
#   Python:     a venv (sdk/python/.venv, git-ignored), pip install './sdk/python[test]',
#               mypy --strict with the Python 3.10 floor, pytest;
#   TypeScript: npm ci, tsc --noEmit (strict), the committed dist/ (ESM and
#               dist/cjs/) equals a fresh build (scripts/build.mjs), node --test.
# SETTLE_BIN names the server binary (default target/release/settle of the
# repository; built with cargo when missing). SDK_VENV overrides the venv path.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

SETTLE_BIN=${SETTLE_BIN:-$ROOT/target/release/settle}
if [ ! -x "$SETTLE_BIN" ]; then
  echo "== building the settle server ($SETTLE_BIN is missing)"
  cargo build --release -p settle --locked
  SETTLE_BIN=$ROOT/target/release/settle
fi
SETTLE_BIN=$(cd "$(dirname "$SETTLE_BIN")" && pwd)/$(basename "$SETTLE_BIN")
export SETTLE_BIN

echo "== Python SDK (settle-client)"
VENV=${SDK_VENV:-$ROOT/sdk/python/.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$ROOT/sdk/python[test]"
(cd sdk/python && "$VENV/bin/python" -m mypy --strict --python-version 3.10)
(cd sdk/python && "$VENV/bin/python" -m pytest -q -p no:cacheprovider)

echo "== TypeScript SDK (@settle/client)"
cd "$ROOT/sdk/typescript"
npm ci --no-audit --no-fund --loglevel=error
npx tsc -p tsconfig.json --noEmit
FRESH=$(mktemp -d)
trap 'rm -rf "$FRESH"' EXIT
node scripts/build.mjs "$FRESH"          # ES modules in dist/, CommonJS in dist/cjs/
if ! diff -r "$FRESH" dist >/dev/null; then
  diff -r "$FRESH" dist | head -40
  echo "sdk/typescript/dist is stale: run 'npm run build' in sdk/typescript and commit dist/" >&2
  exit 1
fi
node --test --test-concurrency=1 test/
