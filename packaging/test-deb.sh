#!/usr/bin/env bash
# The Debian package, as an operator installs it (./test package; CI):
# builds it (packaging/deb.sh), installs it with dpkg -i, checks the files
# it placed, verifies the unit with systemd-analyze where there is one,
# runs the installed binary with the packaged configuration (listen and
# data overridden by flags, so it can run next to anything) until /readyz
# answers 200, stops it with SIGTERM (exit 0), then removes and purges the
# package and checks that nothing of it is left. Needs root (or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
fail() { echo "package test: $*" >&2; exit 1; }

# --fast: lighter compression (the test needs the contents, not the size).
deb=$(packaging/deb.sh --fast | tail -n 1)
[ -f "$deb" ] || fail "cargo deb did not print the package path (got: $deb)"
echo "== installing $deb"
as_root dpkg -i "$deb" >/dev/null
cleanup() { as_root dpkg -P settle >/dev/null 2>&1 || true; }
trap cleanup EXIT

for f in /usr/bin/settle /etc/settle/settle.toml /lib/systemd/system/settle.service \
         /usr/share/man/man1/settle.1.gz /usr/share/bash-completion/completions/settle \
         /usr/share/zsh/vendor-completions/_settle /usr/share/fish/vendor_completions.d/settle.fish; do
  [ -f "$f" ] || fail "$f is not installed"
done
dpkg-query -W -f='${Conffiles}\n' settle | grep -q /etc/settle/settle.toml || fail "settle.toml is not a conffile"
/usr/bin/settle --version | grep -q '^settle ' || fail "the installed binary does not run"
zcat /usr/share/man/man1/settle.1.gz | grep -q '^\.TH settle 1' || fail "the man page is not roff"
grep -q 'complete -F _settle' /usr/share/bash-completion/completions/settle || fail "the bash completion does not register"

if command -v systemd-analyze >/dev/null; then
  echo "== systemd-analyze verify settle.service"
  # verify checks the unit's syntax, ExecStart and its directives; it needs
  # no running systemd.
  systemd-analyze verify /lib/systemd/system/settle.service
else
  echo "== systemd-analyze is not installed: the unit file is not verified"
fi

echo "== the installed binary with the packaged configuration"
dir=$(mktemp -d)
out=$dir/stdout
SETTLE_LOG=warn /usr/bin/settle serve --config /etc/settle/settle.toml --data "$dir/data" --listen 127.0.0.1:0 >"$out" 2>"$dir/stderr" &
pid=$!
for _ in $(seq 1 100); do
  grep -q '^listening on ' "$out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/stderr" >&2; fail "settle serve exited before listening"; }
  sleep 0.1
done
addr=$(sed -n 's/^listening on //p' "$out")
[ -n "$addr" ] || fail "settle serve did not print its address"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/readyz")
[ "$code" = 200 ] || fail "GET /readyz answered $code"
kill -TERM "$pid"
wait "$pid" || fail "settle serve exited $? after SIGTERM"
rm -rf "$dir"

echo "== removing the package"
as_root dpkg -r settle >/dev/null
[ ! -e /usr/bin/settle ] || fail "/usr/bin/settle is left after dpkg -r"
[ -f /etc/settle/settle.toml ] || fail "dpkg -r removed the conffile (only purge should)"
as_root dpkg -P settle >/dev/null
[ ! -e /etc/settle/settle.toml ] || fail "/etc/settle/settle.toml is left after dpkg -P"
trap - EXIT
echo "== the Debian package installs, serves and uninstalls"
