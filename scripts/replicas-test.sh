#!/usr/bin/env bash
# Replicas behind a balancer, for real, on loopback: 3 `streampool serve` processes (CPU,
# the shipped tiny model + the demo MLP) behind nginx (Debian's package) running
# deploy/nginx/streampool.conf with the ports substituted. A bounded load run goes through
# nginx (scripts/replicas_client.py: threads, keep-alive, every answer checked against a
# known answer) while replica 2 gets SIGTERM (drain) and replica 3 gets SIGKILL mid-run;
# replica 2 is then started again on its port (a rolling restart). Reports: answers right,
# clear errors by status, mismatches (must be 0), hangs (must be 0), nginx's retries, how
# long the SIGTERM drain took and its exit status. Everything on 127.0.0.1; stops it all
# on exit.
#
#   scripts/replicas-test.sh                      # 20 s of load, 16 client threads
#   SECONDS_LOAD=10 THREADS=8 scripts/replicas-test.sh
#   BIN=/tmp/streampool REPORT=bench/results/replicas/README.md scripts/replicas-test.sh
#   NO_RETRY_POST=1 scripts/replicas-test.sh      # nginx without `non_idempotent`, to compare
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-target/release/streampool}
BASE_PORT=${BASE_PORT:-18180}      # nginx; replicas on BASE_PORT+1..+3
SECONDS_LOAD=${SECONDS_LOAD:-20}
THREADS=${THREADS:-16}
MAX_REQUESTS=${MAX_REQUESTS:-200000}
CLIENT_TIMEOUT=${CLIENT_TIMEOUT:-40}
TERM_AT=${TERM_AT:-5}              # seconds into the load: SIGTERM replica 2
KILL_AT=${KILL_AT:-8}              # SIGKILL replica 3
RESTART_AT=${RESTART_AT:-12}       # start replica 2 again
DRAIN_TIMEOUT=${DRAIN_TIMEOUT:-15}
REPORT=${REPORT:-}
NO_RETRY_POST=${NO_RETRY_POST:-}
SERVE_ARGS=(--workers 1 --max-queue 4096 --timeout-s 10 --drain-timeout-secs "$DRAIN_TIMEOUT")

command -v nginx >/dev/null || { echo "nginx not found: apt-get install nginx-light" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release -p streampool-cli >&2
BIN=$(realpath "$BIN")

tmp=$(mktemp -d)
chmod 755 "$tmp" # nginx workers run as nobody when started as root
declare -A pid
nginx_pid=
client_pid=
stop_all() {
    set +e
    [ -n "$client_pid" ] && kill -KILL "$client_pid" 2>/dev/null
    for r in "${!pid[@]}"; do
        kill -TERM "${pid[$r]}" 2>/dev/null
    done
    [ -n "$nginx_pid" ] && kill -QUIT "$nginx_pid" 2>/dev/null
    # Bounded wait, then no mercy: a drain takes at most DRAIN_TIMEOUT.
    for _ in $(seq 1 $((DRAIN_TIMEOUT * 10 + 20))); do
        alive=0
        for p in "${pid[@]}" $nginx_pid; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for p in "${pid[@]}" $nginx_pid; do kill -KILL "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

port() { echo $((BASE_PORT + $1)); }
start_replica() { # start_replica N
    "$BIN" serve --port "$(port "$1")" "${SERVE_ARGS[@]}" >>"$tmp/replica$1.log" 2>&1 &
    pid[$1]=$!
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

for r in 1 2 3; do start_replica "$r"; done
urls=()
for r in 1 2 3; do urls+=("http://127.0.0.1:$(port "$r")"); done
python3 scripts/replicas_client.py ready "${urls[@]}"

# nginx: the shipped config with this run's ports, inside a minimal main config.
mkdir -p "$tmp/nginx/logs"
sed -e "s/127\.0\.0\.1:8001/127.0.0.1:$(port 1)/; s/127\.0\.0\.1:8002/127.0.0.1:$(port 2)/" \
    -e "s/127\.0\.0\.1:8003/127.0.0.1:$(port 3)/; s/listen 127\.0\.0\.1:8080;/listen 127.0.0.1:$BASE_PORT;/" \
    deploy/nginx/streampool.conf >"$tmp/nginx/streampool.conf"
if [ -n "$NO_RETRY_POST" ]; then
    sed -i 's/ non_idempotent;/;/' "$tmp/nginx/streampool.conf"
fi
grep -q "127.0.0.1:$(port 3) " "$tmp/nginx/streampool.conf" || { echo "port substitution failed" >&2; exit 1; }
cat >"$tmp/nginx/nginx.conf" <<EOF
daemon off;
worker_processes 2;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
    # One line per request: status, every replica tried and its status (retries show as
    # "a, b" lists).
    log_format replicas '\$msec \$status "\$upstream_addr" "\$upstream_status" \$request_time';
    access_log $tmp/nginx/logs/access.log replicas;
    # The client keeps its connections for the whole run.
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    include $tmp/nginx/streampool.conf;
}
EOF
nginx -t -q -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf"
nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" &
nginx_pid=$!
python3 scripts/replicas_client.py ready "http://127.0.0.1:$BASE_PORT"
python3 scripts/replicas_client.py reference "$BIN" "$tmp/reference.json" "${urls[@]}" | tee "$tmp/reference.txt"
: >"$tmp/nginx/logs/access.log" # count the load run only (nginx appends to the same file)

python3 scripts/replicas_client.py load "$tmp/reference.json" "http://127.0.0.1:$BASE_PORT" \
    "$tmp/load.json" --threads "$THREADS" --seconds "$SECONDS_LOAD" \
    --max-requests "$MAX_REQUESTS" --timeout "$CLIENT_TIMEOUT" >"$tmp/load.txt" &
client_pid=$!
t0=$(now)
exited() { # exited PID: the process has ended (a zombie not yet waited for counts)
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 0
    [ -z "$state" ] || [ "$state" = Z ]
}
sleep "$TERM_AT"
t_term=$(now)
kill -TERM "${pid[2]}"
# Replica 2's drain: the time from SIGTERM until it exited (polled every 10 ms until the
# SIGKILL is due; after that, the time `wait` returns), and its exit status.
t_exit=
while awk -v a="$KILL_AT" -v t0="$t0" -v n="$(now)" 'BEGIN { exit !(n - t0 < a) }'; do
    if [ -z "$t_exit" ] && exited "${pid[2]}"; then t_exit=$(now); fi
    sleep 0.01
done
t_kill=$(now)
kill -KILL "${pid[3]}"
set +e
wait "${pid[2]}"
term_status=$?
set -e
[ -n "$t_exit" ] || t_exit=$(now)
wait "${pid[3]}" 2>/dev/null || true
unset 'pid[3]'
sleep "$(awk -v a="$RESTART_AT" -v t0="$t0" -v n="$(now)" 'BEGIN { d = a - (n - t0); print (d > 0 ? d : 0) }')"
t_restart=$(now)
start_replica 2
wait "$client_pid"
client_pid=
t_end=$(now)

{
    echo "# Replicas behind nginx: SIGTERM and SIGKILL under load ($(date -u +%F))"
    echo
    echo "\`scripts/replicas-test.sh\` on this machine ($(nproc) cores, shared with other builds),"
    echo "$(nginx -v 2>&1 | sed 's/nginx version: //') (Debian), the release \`streampool\` binary (CPU)."
    echo "3 replicas \`streampool serve ${SERVE_ARGS[*]}\` (tiny-bert + MLP) on"
    echo "127.0.0.1:$(port 1)-$(port 3); nginx on 127.0.0.1:$BASE_PORT running deploy/nginx/streampool.conf"
    echo "with \`$(grep -o 'proxy_next_upstream [^;]*' "$tmp/nginx/streampool.conf")\`."
    echo "Client (scripts/replicas_client.py): $THREADS threads, each on its own keep-alive connection,"
    echo "alternating \`/v1/embeddings\` of 16 known texts (checked against \`streampool embed --json\`,"
    echo "in-process, no server) and KServe infer of 16 known MLP rows (checked against the answer all"
    echo "3 replicas gave before the run); ${SECONDS_LOAD} s or $MAX_REQUESTS requests, whichever first."
    echo
    python3 scripts/replicas_client.py report "$tmp/load.json" "$tmp/nginx/logs/access.log" \
        --ports "$(port 1)" "$(port 2)" "$(port 3)" \
        --times "$t0" "$t_term" "$t_kill" "$t_exit" "$t_restart" "$t_end" \
        --term-status "$term_status" --drain-timeout "$DRAIN_TIMEOUT"
    echo
    echo "Replica 2's log around the SIGTERM:"
    echo
    echo '```'
    grep -E "SIGTERM|shutting down|stopped|drain" "$tmp/replica2.log" | sed 's/\x1b\[[0-9;]*m//g' | head -6
    echo '```'
} >"$tmp/report.md"
cat "$tmp/report.md"
if [ -n "$REPORT" ]; then
    cp "$tmp/report.md" "$REPORT"
    cp "$tmp/load.json" "${REPORT%.md}.json"
fi
grep -q '^Verdict: \*\*PASS' "$tmp/report.md"
