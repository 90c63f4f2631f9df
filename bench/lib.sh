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

# Starts BINARY serve on DIR at a free loopback port; sets SERVER_PID and URL.
start_server() { # binary data-dir
  "$1" serve --listen 127.0.0.1:0 --data "$2" >"$WORK/serve.out" 2>"$WORK/serve.err" &
  SERVER_PID=$!
  for _ in $(seq 100); do
    if grep -q '^listening on ' "$WORK/serve.out"; then break; fi
    sleep 0.1
  done
  local addr
  addr=$(sed -n 's/^listening on //p' "$WORK/serve.out" | head -1)
  [[ -n $addr ]] || { echo "settle serve did not start" >&2; cat "$WORK/serve.err" >&2; exit 1; }
  URL=http://$addr
}

stop_server() {
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
