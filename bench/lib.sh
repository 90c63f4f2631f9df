# Shared by bench/run and bench/ab (sourced, not run): a work directory
# removed on exit (with any server still running), JSON lines tagged as
# they come, and a settle server on a free port.

WORK=$(mktemp -d)
LINES=$WORK/lines.jsonl
SERVER_PID=
cleanup() {
  if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# Appends each JSON line of stdin to $LINES as {FIELD: VALUE, "round": ROUND, "result": line}.
record() { # field value round
  while IFS= read -r line; do
    [[ $line == \{* ]] || continue
    printf '{"%s":"%s","round":%s,"result":%s}\n' "$1" "$2" "$3" "$line" >>"$LINES"
  done
}

# Records each JSON line by its "mode" under the case named for it
# (MODE=CASE arguments); lines of other modes are dropped.
by_mode() { # round mode=case...
  local round=$1 line m pair
  shift
  while IFS= read -r line; do
    [[ $line == \{* ]] || continue
    m=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("mode", ""))' "$line")
    for pair in "$@"; do
      if [[ ${pair%%=*} == "$m" ]]; then
        printf '%s\n' "$line" | record case "${pair#*=}" "$round"
      fi
    done
  done
}

# Records each JSON line under PREFIX_<its "connections">.
by_connections() { # round prefix
  local line c
  while IFS= read -r line; do
    [[ $line == \{* ]] || continue
    c=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["connections"])' "$line")
    printf '%s\n' "$line" | record case "$2_$c" "$1"
  done
}

# Starts BINARY serve on DIR at a free loopback port (with any further
# serve flags, e.g. --tls-cert/--tls-key); sets SERVER_PID and URL
# (https:// when --tls-cert is among the flags).
start_server() { # binary data-dir [serve flags...]
  local bin=$1 dir=$2 scheme=http
  shift 2
  [[ " $* " == *" --tls-cert "* ]] && scheme=https
  : >"$WORK/serve.out"
  "$bin" serve --listen 127.0.0.1:0 --data "$dir" "$@" >"$WORK/serve.out" 2>"$WORK/serve.err" &
  SERVER_PID=$!
  for _ in $(seq 100); do
    if grep -q '^listening on ' "$WORK/serve.out"; then break; fi
    sleep 0.1
  done
  local addr
  addr=$(sed -n 's/^listening on //p' "$WORK/serve.out" | head -1)
  [[ -n $addr ]] || { echo "settle serve did not start" >&2; cat "$WORK/serve.err" >&2; exit 1; }
  URL=$scheme://$addr
}

# Writes a CA (ca.pem) and a certificate for 127.0.0.1 it signed
# (cert.pem, key.pem) into DIR, with the openssl command (P-256 keys).
make_tls() { # dir
  mkdir -p "$1"
  (
    cd "$1"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
      -subj /CN=settle-bench-ca -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj /CN=127.0.0.1 -keyout key.pem -out req.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf
    openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile ext.cnf -out cert.pem 2>/dev/null
  )
}

stop_server() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}

# Prints one JSON line: the disk's write + fdatasync latency where DIR is,
# for 4 KiB and 256 KiB writes (a log frame at 1 and at ~1,000 in flight),
# COUNT (default 200) of each into a preallocated file, as the log writes.
# The embedded store's figures are bounded by this disk: on these VMs its
# p50 has been seen from 0.3 to 1.7 ms in one day, so every run records it.
disk_probe() { # dir
  python3 - "$1" "${PROBE_COUNT:-200}" <<'PY'
import json, os, sys, time
d, count = sys.argv[1], int(sys.argv[2])
path = os.path.join(d, "fsync-probe")
out = {"mode": "disk_fsync"}
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
try:
    for size, name in ((4096, "4k"), (256 * 1024, "256k")):
        os.ftruncate(fd, 0)
        os.ftruncate(fd, size * count)
        os.fsync(fd)
        buf = b"\x5a" * size
        lat = []
        for i in range(count):
            t = time.perf_counter()
            os.pwrite(fd, buf, i * size)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e3)
        lat.sort()
        pick = lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 3)
        out[f"p50_ms_{name}"] = pick(0.5)
        out[f"p99_ms_{name}"] = pick(0.99)
        out[f"syncs_per_s_{name}"] = round(count / (sum(lat) / 1e3), 1)
finally:
    os.close(fd)
    os.unlink(path)
print(json.dumps(out))
PY
}
