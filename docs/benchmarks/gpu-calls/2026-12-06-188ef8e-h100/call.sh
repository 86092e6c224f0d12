#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set):
#   0. parity of the head, its bits against cbb1c82's; GPU tests never run yet: the tuning file
#      taken up by a second copy, --cuda-pool-keep-mib, the tower's pixels written as bf16
#      through pinned memory (vision_tiny's GPU tests: the features against transformers,
#      several images in one pass; cuda_ops' write_parts);
#   1. goal-less requests (8 questions over ~2,000 tokens, one client, 40 requests) with each
#      pass's rows and time: the pool as by default, an arena that holds the questions' pass
#      (--carry-arena-prefix-tokens 16384: captured, staged without allocating), and
#      --cuda-pool-keep-mib 4096, alternated (the second round if time is left), and once with
#      prefix reuse off (--prefix-cache-mib 0: issue 19's 4x is against it). At cbb1c82
#      that pass took 26.6 ms for 975 rows where a plain ~1,000-row forward takes 15-17 ms:
#      8 x 1,792 prefix rows exceed the arena's 2,048, so it ran as launched and staged ~1.3 GB
#      in buffers allocated and freed each pass;
#   2. if time is left, the vision tower alone (`instinct bench --image-sizes 1024x1024`), as
#      by default and with --cuda-pool-keep-mib 4096 (the tower allocates ~230 MB of
#      activations per pass);
#   3. if time is left, gpu_vl_check.sh with --carry-arena-prefix-tokens 8192 (four questions
#      on a cached screenshot resume from ~4 x 1,100 prefix rows): parity, a miss's encode with
#      the bf16 pixels, bits against 99b9d07's screenshot answers;
#   4. if time is left, the tower's kernels under Nsight Compute, then gpu_load.sh with both
#      options.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest, tests/cuda_gemm_tuning-test,
# tests/cuda_memory_pool-test, tests/vision_tiny-test, tests/cuda_ops-test), .cache/qwen-tokenizer,
# .cache/fixtures (and .cache/instinct-kernels where an earlier call's kernel-cache.tgz was
# unpacked there). Returns results.tgz, load.tgz, kernel-cache.tgz.
#   REV=<sha> [CALL_S=570] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
# The device returns at most 8 files: logs and reports go to $R, packed into $OUT/results.tgz.
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
run_test cuda_gemm_tuning-test 120
run_test cuda_memory_pool-test 60
run_test vision_tiny-test 60
run_test cuda_ops-test 60 write_parts
tests_summary
wait_checkpoint
BIN=.carry/bin
# Whole-model parity (84 questions) and its bits against cbb1c82's.
parity
same_bits_as 2026-12-06-cbb1c82-h100
# 1. Goal-less requests: the servers through gpu_common.sh's serve_real, each pass logged.
source tools/reference/gpu_common.sh
stamp() { t "$@"; }
REAL=/tmp/real PORT=8124
start() {
  local name=$1; shift
  INSTINCT_LOG=info,instinct::prefix_reuse=debug OUT=$R serve_real "$name" 240 "$@"
}
stop() { stop_server; gzip -f "$R/serve_$1.log"; }
LT=($BIN/instinct-loadtest --target http://127.0.0.1:8124 --quiet)
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
goal_less goal_less_default_1
goal_less goal_less_arena_1 --carry-arena-prefix-tokens 16384
goal_less goal_less_keep_1 --cuda-pool-keep-mib 4096
goal_less goal_less_off --prefix-cache-mib 0
if (( $(left) > 330 )); then
  goal_less goal_less_default_2
  goal_less goal_less_arena_2 --carry-arena-prefix-tokens 16384
  goal_less goal_less_both --carry-arena-prefix-tokens 16384 --cuda-pool-keep-mib 4096
fi
pack
# 2. The tower alone (if time is left).
(( $(left) > 190 )) && for keep in "" 4096; do
  timeout 90 $BIN/instinct bench --model /tmp/real --device cuda:0 --image-sizes 1024x1024 --runs 30 \
    --warmup 3 ${keep:+--cuda-pool-keep-mib $keep} --revision "$REV" --out $R/tower_keep${keep:-0}.json \
    > $R/tower_keep${keep:-0}.log 2>&1
  t "tower keep ${keep:-0} exit $?"
  grep -E "^\[bench\] (vision|.*loaded)" $R/tower_keep${keep:-0}.log | sed "s/^/keep ${keep:-0}: /" >> $L
done
pack
# 3. Screenshots with an arena for 8,192 prefix tokens.
if (( $(left) > 130 )); then
  OUT=/tmp/vl SERVE_FLAGS="--carry-arena-prefix-tokens 8192" timeout 120 bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "vl (arena 8192) exit $?"
  grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
  cp /tmp/vl/vl_parity.json $R/vl_parity_arena8192.json 2> /dev/null
  python3 - $R/vl_parity_arena8192.json docs/benchmarks/gpu-calls/2026-12-06-99b9d07-h100/vl/vl_parity.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p))["rows"] for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a, b))
print(f"screenshots: {same} of {len(a)} answers identical to 99b9d07's")
PY
fi
pack
# Nsight Compute of the tower, if time is left.
if (( $(left) > 80 )); then
t "ncu tower"
timeout $(( $(left) - 10 < 70 ? $(left) - 10 : 70 )) ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
  $BIN/instinct bench --model /tmp/real --device cuda:0 --image-sizes 1024x1024 --runs 1 --warmup 1 \
  > /tmp/ncu_tower.csv 2> /tmp/ncu_tower.err
t "ncu exit $?"
gzip -c /tmp/ncu_tower.csv > $R/ncu-tower.csv.gz
python3 tools/reference/ncu_forward.py /tmp/ncu_tower.csv > $R/ncu-tower.md 2>> $L
head -24 $R/ncu-tower.md >> $L
fi
pack
# 4. The load with both options.
SERVE_FLAGS="--cuda-pool-keep-mib 4096 --carry-arena-prefix-tokens 16384" load_stage
save_kernel_cache
t done
