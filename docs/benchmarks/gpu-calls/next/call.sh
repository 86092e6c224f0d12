#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set): why a pass of 8 questions resumed from
# a 1,792-token snapshot each took 26.6 ms for 975 rows (goal-less requests at cbb1c82) where a
# forward of ~1,000 rows takes 15-17 ms. Such a pass does not fit the carry arena (2,048 prefix
# rows), so it runs as launched and stages its states (~1.3 GB) in buffers allocated and freed
# every pass; the driver's pool hands freed memory back at each synchronization. (Four questions
# on a cached 1024x1024 screenshot resume from ~4 x 1,100 prefix rows: out of the arena too, which
# may be part of why they take 2x one question.)
#   0. the GPU tests of the tuning file (a second copy takes up the first's winners) and of
#      --cuda-pool-keep-mib (neither has run on a GPU yet);
#   1. goal-less requests (8 questions over ~2,000 tokens, one client, 40 requests) with each
#      pass's rows and time: the pool as by default, --cuda-pool-keep-mib 4096, and an arena
#      that holds the pass (--carry-arena-prefix-tokens 16384: captured, staged without
#      allocating), alternated twice;
#   2. the same pass in `instinct bench`, with and without the flag, beside a plain 1,024-id pass;
#   3. gpu_load.sh with --cuda-pool-keep-mib 4096 (the mix's batches of more than 1,024 rows
#      stage outside the arena too), against the load of cbb1c82;
#   4. gpu_vl_check.sh with --carry-arena-prefix-tokens 8192 (four questions on a cached
#      screenshot), if time is left;
#   5. Nsight Compute of `instinct bench` resuming 8 questions of 1,920 ids from 1,792, if time is
#      left: which kernels grow with the prefix.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_gemm_tuning-test,
# tests/cuda_memory_pool-test), .cache/qwen-tokenizer, .cache/fixtures (and .cache/instinct-kernels
# where an earlier call's kernel-cache.tgz was unpacked there). Returns kernel-cache.tgz.
#   REV=<sha> [CALL_S=560] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
# The device returns at most 8 files: logs and reports go to $R, packed into $OUT/results.tgz.
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_gemm_tuning-test 120
run_test cuda_memory_pool-test 60
tests_summary
wait_checkpoint
# The servers: gpu_common.sh's serve_real (logs in $R/serve_NAME.log), each pass logged.
source tools/reference/gpu_common.sh
stamp() { t "$@"; }
BIN=.carry/bin REAL=/tmp/real PORT=8124
start() {
  local name=$1; shift
  INSTINCT_LOG=info,instinct::prefix_reuse=debug OUT=$R serve_real "$name" 240 "$@"
}
stop() { stop_server; gzip -f "$R/serve_$1.log"; }
LT=(.carry/bin/instinct-loadtest --target http://127.0.0.1:8124 --quiet)
# goal_less NAME [FLAGS]: a server, 40 goal-less requests at one client, each pass's median.
goal_less() {
  local name=$1; shift
  start "$name" "$@"
  timeout 60 "${LT[@]}" --goal-less --questions 8 --prompt-tokens 2000 --synthetic-count 64 --seed 7 \
    --concurrency 1 --requests 40 --duration 20 --warmup 2 --json "$R/$name.json" > /dev/null 2>&1
  t "$name exit $?"
  python3 - "$R/serve_$name.log" "$R/$name.json" "$name" >> $L 2>&1 <<'PY'
import json, re, statistics, sys
ansi = re.compile(r"\x1b\[[0-9;]*m")
passes = {}
for line in open(sys.argv[1]):
    line = ansi.sub("", line)
    if "forward pass" in line:
        f = dict(re.findall(r"(\w+)=(\S+)", line))
        passes.setdefault(f["pass"], []).append((int(f["rows"]), float(f["ms"])))
level = json.load(open(sys.argv[2]))["levels"][0]
print(f"{sys.argv[3]}: {level['decision_throughput']:.1f} decisions/s; "
      + "; ".join(f"{k} passes {len(v)}, rows {statistics.median(r for r, _ in v)}, "
                  f"ms {statistics.median(m for _, m in v):.2f}" for k, v in passes.items()))
PY
  stop "$name"
}
for n in 1 2; do
  goal_less goal_less_default_$n
  goal_less goal_less_keep_$n --cuda-pool-keep-mib 4096
  goal_less goal_less_arena_$n --carry-arena-prefix-tokens 16384
done
pack
# The same pass alone, in `instinct bench`: 8 questions of 1,920 ids resumed from their first
# 1,792 (1,024 rows), beside one plain question of 1,024 ids, each way.
for keep in "" 4096; do
  .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --lengths 1024 --batch-sizes 8 --batch-prompt-tokens 1920 --resume-tokens 1792 --runs 10 \
    --batch-runs 10 --warmup 2 ${keep:+--cuda-pool-keep-mib $keep} --out $R/bench_keep${keep:-0}.json \
    > /tmp/bench_keep${keep:-0}.log 2>&1
  t "bench keep ${keep:-0} exit $?"
  grep -E "^\[bench\] (latency|batch)" /tmp/bench_keep${keep:-0}.log | sed "s/^/keep ${keep:-0}: /" >> $L
done
SERVE_FLAGS="--cuda-pool-keep-mib 4096" load_stage
# Four questions on a cached screenshot resume from ~4 x 1,100 prefix rows: with an arena for
# 8,192 their pass is captured (hit_4q was 15.85 ms at cbb1c82 on another H100, 1.95x one).
if (( $(left) > 170 )); then
  OUT=/tmp/vl SERVE_FLAGS="--carry-arena-prefix-tokens 8192" timeout 120 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl (arena 8192) exit $?"
  grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
  cp /tmp/vl/vl_parity.json $R/vl_parity_arena8192.json 2> /dev/null
fi
if (( $(left) > 80 )); then
  t "ncu resumed"
  timeout $(( $(left) - 10 < 90 ? $(left) - 10 : 90 )) ncu --metrics gpu__time_duration.sum --csv \
    --cache-control none --clock-control none --graph-profiling node .carry/bin/instinct bench \
    --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 --lengths 16 --batch-sizes 8 \
    --batch-prompt-tokens 1920 --resume-tokens 1792 --runs 1 --batch-runs 1 --warmup 1 \
    > /tmp/ncu_resumed.csv 2> /tmp/ncu_resumed.err
  t "ncu exit $?"
  gzip -c /tmp/ncu_resumed.csv > $R/ncu-resumed.csv.gz
  python3 tools/reference/ncu_forward.py /tmp/ncu_resumed.csv > $R/ncu-resumed.md 2>> $L
  head -16 $R/ncu-resumed.md >> $L
fi
pack
save_kernel_cache
t done
