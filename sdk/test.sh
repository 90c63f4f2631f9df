#!/usr/bin/env bash
# The SDK checks, against a real settle binary (and, for the runners of
# sdk/fault-vectors.json, settle-faultproxy in front of it):
#   Python:     a venv (sdk/python/.venv, git-ignored), pip install './sdk/python[test]',
#               mypy --strict with the Python 3.10 floor, pytest;
#   TypeScript: npm ci, tsc --noEmit (strict), the committed dist/ (ESM and
#               dist/cjs/) equals a fresh build (scripts/build.mjs), node --test;
# and again in process, without a server (the native packages, each built
# once per run, in release, on the workspace's target/, in the background
# while the suites above run):
#   Python:     a wheel of ./sdk/python-local (maturin) installed, mypy --strict, its
#               tests, then the whole suite with SETTLE_TEST_LEDGER=local;
#   TypeScript: npm ci in sdk/typescript-local (its install script,
#               scripts/install.cjs, runs cargo build -p settle-node: the
#               same profile and flags as maturin's, so it reuses every
#               dependency the Python build compiled), its tests, then the
#               @settle/client suite with SETTLE_TEST_LEDGER=local;
# and, in the background while those run, the install commands of
# docs/sdk.md from a new project outside the repository, and the reuse of
# a wheel and tarballs (sdk/install-test.sh): cargo finds everything built.
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

# The fault-injecting proxy the fault-vector runners put in front of
# settle serve (crates/settle-faultproxy; `cargo test` builds it into
# target/debug with its own integration tests).
SETTLE_FAULTPROXY_BIN=${SETTLE_FAULTPROXY_BIN:-$ROOT/target/debug/settle-faultproxy}
if [ ! -x "$SETTLE_FAULTPROXY_BIN" ]; then
  echo "== building settle-faultproxy ($SETTLE_FAULTPROXY_BIN is missing)"
  cargo build -p settle-faultproxy --locked
  SETTLE_FAULTPROXY_BIN=$ROOT/target/debug/settle-faultproxy
fi
export SETTLE_FAULTPROXY_BIN

# The docs' failure tables are generated from sdk/fault-vectors.json.
echo "== failure tables (sdk/tools/fault_tables.py --check)"
python3 "$ROOT/sdk/tools/fault_tables.py" --check

echo "== Python SDK (settle-client)"
VENV=${SDK_VENV:-$ROOT/sdk/python/.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$ROOT/sdk/python[test]"

# The two native crates must ask for the same features of every dependency
# they share, or the second build compiles the server again (docs/sdk.md,
# "Build mechanics"): a crate in both trees with other features fails here.
native_tree() {
  cargo tree --locked -e normal,build --prefix none --no-dedupe -f '{p} [{f}]' -p "$1" \
    | sed -E 's/ \((\*|proc-macro)\)//g; s/ \(\/[^)]*\)//' | sort -u
}
py_tree=$(native_tree settle-python)
node_tree=$(native_tree settle-node)
differ=$(comm -12 <(comm -23 <(echo "$py_tree") <(echo "$node_tree") | cut -d' ' -f1,2 | sort -u) \
                  <(comm -13 <(echo "$py_tree") <(echo "$node_tree") | cut -d' ' -f1,2 | sort -u))
if [ -n "$differ" ]; then
  grep -F -e "$differ" <<<"$py_tree" | sed 's/^/settle-python: /' >&2
  grep -F -e "$differ" <<<"$node_tree" | sed 's/^/settle-node:   /' >&2
  echo "settle-python and settle-node resolve these crates with different features:" \
    "unify them (as syn in sdk/*-local/Cargo.toml)" >&2
  exit 1
fi

# The native packages (release builds: minutes on 2 cores) are built in
# the background, at the lowest priority, while the suites against the
# server run: those mostly wait on sockets and timers (the Python suite
# used 22 s of CPU in 135 s). One after the other: they share target/.
NATIVE_DIR=$(mktemp -d)
(
  set -e
  t0=$SECONDS
  nice -n 19 "$VENV/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
    -w "$NATIVE_DIR/wheels" "$ROOT/sdk/python-local"
  echo "native: settle-local wheel (maturin) built in $((SECONDS - t0)) s" >"$NATIVE_DIR/times"
  t0=$SECONDS
  cd "$ROOT/sdk/typescript-local"
  nice -n 19 npm ci --no-audit --no-fund --loglevel=error   # its install script: cargo build -p settle-node
  echo "native: @settle/local (cargo build -p settle-node) built in $((SECONDS - t0)) s" >>"$NATIVE_DIR/times"
) >"$NATIVE_DIR/build.log" 2>&1 &
NATIVE=$!
trap 'kill "$NATIVE" ${INSTALL:-} 2>/dev/null || true; rm -rf "$NATIVE_DIR" "${FRESH:-}"' EXIT
native_built() {
  if ! wait "$NATIVE"; then
    cat "$NATIVE_DIR/build.log" >&2
    echo "building the native packages (sdk/python-local, sdk/typescript-local) failed" >&2
    exit 1
  fi
  cat "$NATIVE_DIR/times"
  # Then, in the background while the local suites run: the install
  # commands of docs/sdk.md from a new project outside the repository, and
  # a second project on a wheel and tarballs (sdk/install-test.sh), with
  # the builds above up to date. After it (it needs cargo's lock on
  # target/release), for ./test all: the Debian package's release build,
  # detached; ./test package's own cargo build waits for it on cargo's lock
  # and finds it done.
  (
    SETTLE_INSTALL_EXPECT_BUILT=1 nice -n 10 bash "$ROOT/sdk/install-test.sh"
    if [ -n "${SETTLE_PREBUILD_RELEASE:-}" ]; then
      (cd "$ROOT" && nice -n 19 cargo build --release -p settle --locked >/dev/null 2>&1 &)
    fi
  ) >"$NATIVE_DIR/install.log" 2>&1 &
  INSTALL=$!
}

(cd sdk/python && "$VENV/bin/python" -m mypy --strict --python-version 3.10)
(cd sdk/python && "$VENV/bin/python" -m pytest -q -p no:cacheprovider)

echo "== TypeScript SDK (@settle/client)"
cd "$ROOT/sdk/typescript"
npm ci --no-audit --no-fund --loglevel=error
npx tsc -p tsconfig.json --noEmit
FRESH=$(mktemp -d)
node scripts/build.mjs "$FRESH"          # ES modules in dist/, CommonJS in dist/cjs/
if ! diff -r "$FRESH" dist >/dev/null; then
  diff -r "$FRESH" dist | head -40
  echo "sdk/typescript/dist is stale: run 'npm run build' in sdk/typescript and commit dist/" >&2
  exit 1
fi
node --test --test-concurrency=1 test/

echo "== Python on the local ledger (settle-local)"
cd "$ROOT"
native_built
# --force-reinstall: the venv outlives a run, and pip keeps an installed
# settle-local of the same version over a wheel of new code.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
  "$NATIVE_DIR"/wheels/settle_local-*.whl
(cd sdk/python-local && "$VENV/bin/python" -m mypy --strict --python-version 3.10 python tests)
(cd sdk/python && "$VENV/bin/python" -m pytest -q -p no:cacheprovider ../python-local/tests)
# faulthandler_timeout: a test stuck for 2 minutes prints every thread's stack.
(cd sdk/python && SETTLE_TEST_LEDGER=local "$VENV/bin/python" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=120)

echo "== TypeScript on the local ledger (@settle/local)"
cd "$ROOT/sdk/typescript-local"   # npm ci (and its cargo build) ran in the background
node --test --test-concurrency=1 test/
cd "$ROOT/sdk/typescript"
SETTLE_TEST_LEDGER=local node --test --test-concurrency=1 test/

echo "== installing from another project (sdk/install-test.sh, run in the background since the native builds)"
if ! wait "$INSTALL"; then
  cat "$NATIVE_DIR/install.log" >&2
  echo "installing the SDKs from another project failed (sdk/install-test.sh)" >&2
  exit 1
fi
cat "$NATIVE_DIR/install.log"
