#!/usr/bin/env bash
# The install commands of docs/sdk.md ("Installing"), run as another
# project runs them: from a new directory outside the repository (mktemp -d),
# a new venv and a new npm project, then a run_once on a LocalLedger and a
# Client of the plain package in each language. Then the reuse path: a
# wheel (pip wheel) and tarballs (npm pack) that carry the built library,
# installed into a second new project without cargo.
#
# sdk/test.sh runs it after it has built both native packages (one cargo
# build of each, on the workspace's target/), so the installs here find
# cargo's artifacts up to date; alone it builds them (minutes).
# Each step prints its wall time. PYTHON picks the interpreter (python3).
# SETTLE_INSTALL_EXPECT_BUILT=1 (sdk/test.sh sets it): fail if cargo
# compiled anything during the installs from the folders, that is, if the
# documented commands did not reuse the builds already made.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
cd "$SCRATCH"
case "$SCRATCH/" in "$ROOT"/*) echo "mktemp -d is inside the repository ($SCRATCH)" >&2; exit 1 ;; esac

step() { printf '== install: %s\n' "$*"; T0=$SECONDS; }
took() { echo "   ($((SECONDS - T0)) s)"; }
expect_built() {
  local compiled
  compiled=$(grep -E '^ *Compiling ' "$1" || true)
  if [ -n "$compiled" ]; then
    echo "   cargo compiled $(wc -l <<<"$compiled") crates: $(sed -E 's/^ *Compiling //; s/ .*//' <<<"$compiled" | tr '\n' ' ')"
    if [ -n "${SETTLE_INSTALL_EXPECT_BUILT:-}" ]; then
      echo "the install rebuilt what sdk/test.sh had built: its cargo flags or features differ from the build's" >&2
      exit 1
    fi
  else
    echo "   cargo: everything up to date ($(grep -o 'Finished .*' "$1" | tail -1))"
  fi
}

PY_CHECK='
from settle_client import Client, Done, run_once
from settle_local import LocalLedger
ledger = LocalLedger()
first = run_once(ledger, "order-7", {"amount": 10}, lambda ctx: Done({"charged": 10}), principal="svc")
again = run_once(ledger, "order-7", {"amount": 10}, lambda ctx: Done({"charged": 99}), principal="svc")
assert isinstance(ledger, Client) and isinstance(Client("http://127.0.0.1:1"), Client)
assert (first.replayed, again.replayed, again.outcome.result) == (False, True, {"charged": 10}), (first, again)
assert first.receipt.durable is False
ledger.close()
print("python: run_once on LocalLedger ok")
'
JS_CHECK='
import { Client, runOnce } from "@settle/client";
import { LocalLedger } from "@settle/local";
import { createRequire } from "node:module";
const ledger = new LocalLedger();
const first = await runOnce(ledger, "order-7", { amount: 10 }, async () => ({ result: { charged: 10 } }), { principal: "svc" });
const again = await runOnce(ledger, "order-7", { amount: 10 }, async () => ({ result: { charged: 99 } }), { principal: "svc" });
const ok = ledger instanceof Client && new Client({ url: "http://127.0.0.1:1" }) instanceof Client
  && !first.replayed && again.replayed && again.result.charged === 10 && first.receipt.durable === false
;
ledger.close();
// require(): the CommonJS build of both packages (its own LocalLedger class, a CommonJS Client).
const require = createRequire(import.meta.url);
const cjs = new (require("@settle/local").LocalLedger)();
const cjsOk = cjs instanceof require("@settle/client").Client && (await runOnce(cjs, "k", {}, async () => ({ result: 1 }), { principal: "svc" })).result === 1;
cjs.close();
if (!ok || !cjsOk) { console.error(JSON.stringify({ cjsOk, first, again })); process.exit(1); }
console.log("node: runOnce on LocalLedger ok (import and require)");
'

# --- from the repository's folders (docs: pip install ./sdk/python ./sdk/python-local)
mkdir py && cd py
step "python: a new venv, pip install $ROOT/sdk/python $ROOT/sdk/python-local"
"$PYTHON" -m venv .venv
# -v: cargo's output (pip hides it otherwise), kept for the check below.
.venv/bin/python -m pip install -v --disable-pip-version-check "$ROOT/sdk/python" "$ROOT/sdk/python-local" >pip.log 2>&1 \
  || { cat pip.log >&2; exit 1; }
took
expect_built pip.log
.venv/bin/python -c "$PY_CHECK"
cd ..

mkdir js && cd js
step "node: npm init -y; npm install $ROOT/sdk/typescript $ROOT/sdk/typescript-local"
npm init -y >/dev/null
npm install --foreground-scripts --no-audit --no-fund --loglevel=error "$ROOT/sdk/typescript" "$ROOT/sdk/typescript-local" >npm.log 2>&1 \
  || { cat npm.log >&2; exit 1; }
took
expect_built npm.log
node --input-type=module -e "$JS_CHECK"
cd ..

# --- a second project reuses the build: a wheel and two tarballs
mkdir artifacts && cd artifacts
step "pip wheel --no-deps $ROOT/sdk/python $ROOT/sdk/python-local"
../py/.venv/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps "$ROOT/sdk/python" "$ROOT/sdk/python-local"
took
step "npm pack $ROOT/sdk/typescript $ROOT/sdk/typescript-local"
npm pack --silent "$ROOT/sdk/typescript" "$ROOT/sdk/typescript-local" >/dev/null
took
ls -l
cd ..

# No cargo on PATH from here: the artifacts must carry the library.
NOCARGO=$SCRATCH/nocargo
mkdir "$NOCARGO"
for t in node npm; do ln -s "$(command -v "$t")" "$NOCARGO/$(basename "$t")"; done
export PATH_NOCARGO=$NOCARGO:/usr/bin:/bin
mkdir py2 && cd py2
step "python: a second venv, pip install the two wheels (no cargo)"
"$PYTHON" -m venv .venv
env PATH="$PATH_NOCARGO" CARGO=/nonexistent .venv/bin/python -m pip install --quiet --disable-pip-version-check ../artifacts/*.whl
took
.venv/bin/python -c "$PY_CHECK"
cd ..

mkdir js2 && cd js2
step "node: a second project, npm install the two tarballs (no cargo)"
npm init -y >/dev/null
env PATH="$PATH_NOCARGO" CARGO=/nonexistent npm install --no-audit --no-fund --loglevel=error ../artifacts/settle-client-*.tgz ../artifacts/settle-local-*.tgz
took
node --input-type=module -e "$JS_CHECK"
echo "== install: all passed"
