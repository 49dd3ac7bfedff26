#!/bin/bash
# $1 = label, $2 = binary, $3 = nofile (hard and soft) or "default", $4 = port
cd /work/wt-conn
out=bench/results/connections
( if [ "$3" != default ]; then ulimit -n $3; fi
  exec $2 serve --port $4 > $out/$1.server.log 2>&1 ) &
spid=$!
for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:$4/v2/health/live && break; sleep 0.2; done
python3 scripts/conn-flood.py --url http://127.0.0.1:$4 --idle 2000 --slow 200 --seconds 25 > $out/$1.json
kill -TERM $spid; wait $spid
echo "$1 exit $?"
