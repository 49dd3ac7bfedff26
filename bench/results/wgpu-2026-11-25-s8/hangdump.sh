#!/usr/bin/env bash
# Runs a test binary (args after the first three) from crates/streampool with a time limit;
# when its output stalls for STALL seconds, dumps every thread's stack (gdb or eu-stack),
# each thread's kernel wait channel and syscall, and the GPU's utilisation, then kills it.
# usage: hangdump.sh NAME LIMIT_S BINARY [test args...]
set -u
name=$1 limit=$2 bin=$3; shift 3
O=${O:-$OUT}; STALL=${STALL:-12}
log=$O/$name.log
start=$(date +%s%N)
(cd ${DIR:-crates/streampool} && exec timeout $limit "$bin" "$@") > $log 2>&1 &
tpid=$!
sleep 0.5
pid=$(cat /proc/$tpid/task/$tpid/children 2>/dev/null | cut -d" " -f1)
last=0; still=0; dumped=0
while kill -0 $tpid 2>/dev/null; do
  sleep 1
  n=$(grep -c '^test .* \.\.\. ' $log)
  if [ "$n" != "$last" ]; then last=$n; still=0; else still=$((still+1)); fi
  if [ $still -ge $STALL ] && [ $dumped = 0 ] && [ -n "$pid" ]; then
    dumped=1
    d=$O/$name-dump.txt
    { echo "=== stalled: $n tests reported, no output for ${STALL}s; pid $pid"; date -u
      nvidia-smi --query-gpu=utilization.gpu,memory.used,power.draw --format=csv
      for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) wchan=$(cat $t/wchan) syscall=$(cut -d' ' -f1 $t/syscall)"; done
      if command -v gdb >/dev/null; then timeout 60 gdb -p $pid -batch -ex 'thread apply all bt' 2>&1
      else LD_LIBRARY_PATH=/tmp/eu/usr/lib/x86_64-linux-gnu timeout 60 /tmp/eu/usr/bin/eu-stack -p $pid 2>&1; fi
      sleep 3; echo "=== 3 s later"; nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader
      for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) wchan=$(cat $t/wchan) syscall=$(cut -d' ' -f1 $t/syscall)"; done
    } > $d 2>&1
    kill -9 $pid 2>/dev/null
  fi
done
wait $tpid; rc=$?
t=$(awk -v a=$start -v b=$(date +%s%N) 'BEGIN{printf "%.1f", (b-a)/1e9}')
printf "%-22s rc=%-3s %5ss  %s%s\n" "$name" "$rc" "$t" "$(grep 'test result' $log | sed 's/test result: //')" "$([ $dumped = 1 ] && echo " HUNG after $last tests: dump in $name-dump.txt")"
grep -E "^test .*FAILED|panicked" $log | head -4
