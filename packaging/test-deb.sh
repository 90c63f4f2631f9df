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
built=$(packaging/deb.sh --fast)
deb=$(grep '/settle_[^/]*\.deb$' <<<"$built" | tail -n 1)
dbgsym=$(grep '/settle-dbgsym_[^/]*\.d\?deb$' <<<"$built" | tail -n 1)
[ -f "$deb" ] || fail "cargo deb did not print the package path (got: $built)"
[ -f "$dbgsym" ] || fail "no settle-dbgsym package next to $deb (got: $built)"
dpkg-deb -c "$dbgsym" | grep -q '/usr/lib/debug/' || fail "$dbgsym holds no debug symbols"
synopsis=$(dpkg-deb -f "$deb" Description | head -n 1)
[ "${#synopsis}" -lt 80 ] || fail "the synopsis has ${#synopsis} characters (under 80): $synopsis"
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
# (.debug_gdb_scripts stays: rustc's pointer to its gdb pretty-printers, not debug info.)
if readelf -S /usr/bin/settle | grep -q -e '\.debug_info' -e '\.debug_line' -e '\.symtab'; then
  fail "/usr/bin/settle is not stripped ($(du -h /usr/bin/settle | cut -f1))"
fi
zcat /usr/share/man/man1/settle.1.gz | grep -q '^\.TH settle 1' || fail "the man page is not roff"
# Every page settle(1) names is installed (clap_mangen writes settle\-serve(1)).
named=$(zcat /usr/share/man/man1/settle.1.gz | sed 's/\\-/-/g' | grep -o 'settle-[a-z-]*(1)' | sort -u)
[ -n "$named" ] || fail "settle(1) names no subcommand page"
for page in $named; do
  f=/usr/share/man/man1/${page%(1)}.1.gz
  [ -f "$f" ] || fail "settle(1) names $page, but $f is not installed"
done
zcat /usr/share/man/man1/settle-serve.1.gz | grep -q 'CONFIGURATION FILE' || fail "settle-serve(1) has no CONFIGURATION FILE section"
zcat /usr/share/man/man1/settle-serve.1.gz | grep -q 'max_queue' || fail "settle-serve(1) does not name the configuration keys"
for f in README.md docs/operations.md docs/http-api.md docs/spec.md; do
  [ -f "/usr/share/doc/settle/$f" ] || fail "/usr/share/doc/settle/$f is not installed"
done
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

echo "== docs/operations.md \"Without systemd\", as written, with TLS"
# The section's two sh blocks, run as they are: the set-up (as root,
# once), then the command the unit runs. The test supplies what an
# operator brings: a CA, a certificate for 127.0.0.1 and a configuration.
blocks=$(mktemp -d)
awk -v dir="$blocks" '
  /^### Without systemd/ { on = 1; next }
  on && /^### / { exit }
  on && /^```sh$/ { n++; inblock = 1; next }
  on && /^```$/ { inblock = 0; next }
  on && inblock { print > (dir "/" n ".sh") }
' docs/operations.md
[ -f "$blocks/1.sh" ] && [ -f "$blocks/2.sh" ] || fail "docs/operations.md: no two sh blocks under \"Without systemd\""
pki=$(mktemp -d)
conf_saved=$(mktemp)
as_root cp /etc/settle/settle.toml "$conf_saved"
walk_cleanup() {
  if [ -f /var/lib/settle/settle.pid ]; then as_root kill -TERM "$(cat /var/lib/settle/settle.pid)" 2>/dev/null || true; fi
  as_root cp "$conf_saved" /etc/settle/settle.toml 2>/dev/null || true
  as_root rm -rf /var/lib/settle /etc/settle/tls /var/log/settle.log "$blocks" "$pki" "$conf_saved"
  if id settle >/dev/null 2>&1; then as_root userdel settle; fi
}
trap 'walk_cleanup; cleanup' EXIT
(
  cd "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 2 -subj /CN=walkthrough-ca -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out server.csr \
    -subj /CN=127.0.0.1 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > ext
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 2 \
    -extfile ext 2>/dev/null
  as_root bash -e "$blocks/1.sh"
)
token=walkthrough-token
digest=$(printf %s "$token" | sha256sum | cut -d' ' -f1)
printf '%s\n' 'listen = "127.0.0.1:0"' 'data = "/var/lib/settle"' \
  'tls_cert = "/etc/settle/tls/cert.pem"' 'tls_key = "/etc/settle/tls/key.pem"' '' \
  '[[tenants]]' 'name = "walkthrough"' "token_sha256 = \"$digest\"" | as_root tee /etc/settle/settle.toml >/dev/null
as_root bash -e "$blocks/2.sh"
for _ in $(seq 1 100); do
  as_root grep -q '^listening on ' /var/log/settle.log 2>/dev/null && [ -f /var/lib/settle/settle.pid ] && break
  sleep 0.1
done
addr=$(as_root sed -n 's/^listening on //p' /var/log/settle.log | tail -n 1)
[ -n "$addr" ] || { as_root cat /var/log/settle.log >&2; fail "the server of \"Without systemd\" did not listen"; }
spid=$(as_root cat /var/lib/settle/settle.pid)
[ "$(stat -c %U "/proc/$spid")" = settle ] || fail "the server runs as $(stat -c %U "/proc/$spid"), not settle"
grep -q '^Umask:[[:space:]]*0077' "/proc/$spid/status" || fail "the server's umask is not 0077"
/usr/bin/settle stats --url "https://$addr" --token "$token" --ca-cert "$pki/ca.pem" --json >/dev/null \
  || fail "settle stats over TLS with the CA failed"
rc=0; /usr/bin/settle stats --url "https://$addr" --token "$token" --json >/dev/null 2>&1 || rc=$?
[ "$rc" = 7 ] || fail "settle stats without the CA exited $rc (7: TLS handshake failed)"
as_root kill -HUP "$spid"
for _ in $(seq 1 100); do
  as_root grep -q 'configuration reload' /var/log/settle.log && break
  sleep 0.1
done
as_root grep -q 'configuration reloaded' /var/log/settle.log || { as_root cat /var/log/settle.log >&2; fail "kill -HUP: the reload was not applied"; }
/usr/bin/settle stats --url "https://$addr" --token "$token" --ca-cert "$pki/ca.pem" --json >/dev/null \
  || fail "settle stats after the reload failed"
as_root kill -TERM "$spid"
for _ in $(seq 1 300); do
  kill -0 "$spid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$spid" 2>/dev/null; then fail "kill -TERM: the server did not exit"; fi
[ ! -e /var/lib/settle/settle.pid ] || fail "the pid file is left after exit"
walk_cleanup
trap cleanup EXIT

echo "== removing the package"
as_root dpkg -r settle >/dev/null
[ ! -e /usr/bin/settle ] || fail "/usr/bin/settle is left after dpkg -r"
[ -f /etc/settle/settle.toml ] || fail "dpkg -r removed the conffile (only purge should)"
as_root dpkg -P settle >/dev/null
[ ! -e /etc/settle/settle.toml ] || fail "/etc/settle/settle.toml is left after dpkg -P"
trap - EXIT
echo "== the Debian package installs, serves and uninstalls"
