#!/usr/bin/env bash
# sanitize-pool-s9.sh (carry [".dev-s9-rc"]: cuda.xz, the stripped `--test cuda` binary of
# streampool built with --features cuda): bash scripts/device/sanitize-pool-s9.sh
# Session 9: the CUDA core suite, then compute-sanitizer (memcheck, racecheck, synccheck) on
# mean_pool_matches_the_cpu_backend (sp_pool_rows in every dtype, both forms).
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('${D:-.dev-s9-rc}/cuda.xz'), open('/tmp/cuda','wb'))"; chmod +x /tmp/cuda
cd crates/streampool
timeout 120 /tmp/cuda --test-threads 4 2>&1 | grep -E "^test |test result" | tee $OUT/suite.log
for tool in memcheck racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool /tmp/cuda mean_pool_matches_the_cpu_backend --test-threads 1 --nocapture > $OUT/$tool.log 2>&1
  echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result|Internal' $OUT/$tool.log | tr '\n' ' ')"
done
