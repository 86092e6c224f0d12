#!/usr/bin/env bash
# One device call: the issue-17 refactor (CUDA ops by family, argument structs, one loader, one
# owner of batch shape) against the build before it, on one GPU. Every GPU test of the new build;
# the seeded real-shape checkpoint; forward rows of both builds alternating (seeded ids: 139, 712
# and 15,446 ids; 32 and 128 x 300-id packed batches); whole-model parity (`instinct check`) of
# both. Everything lands in $OUT/$NAME.tar.gz.
# Run from the repository root on the GPU machine, carrying .carry (.carry/bin/instinct = the new
# build, .carry/bin/instinct-base = BASE), .cache/qwen-tokenizer:
#   BASE=<sha> REV=<sha> NAME=<call> bash docs/benchmarks/instinct-h200/2026-12-04-issue17/call.sh
export INSTINCT_CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
NAME=${NAME:-call}
D=/tmp/$NAME; mkdir -p $D
L=$D/$NAME.log
HW="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"
T0=$(date +%s); t() { echo "=== [$(( $(date +%s) - T0 )) s] $*" >> $L; }
t "checkpoint in the background; hardware $HW; base $BASE, new $REV"
( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
  cd tools/reference && timeout 150 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
  echo "ckpt exit $?" >> /tmp/ckpt.log ) &
CK=$!
t "GPU tests (every ignored test of the carried test executables but the op timing)"
for T in .carry/tests/*; do
  case $T in *op_timing*) continue;; esac
  echo "## $T" >> $D/gpu_tests.raw
  timeout 240 $T --ignored --test-threads=1 >> $D/gpu_tests.raw 2>&1; echo "$(basename $T) exit $?" >> $L
done
grep -E "^## |^test |test result|panicked" $D/gpu_tests.raw > $D/gpu_tests.log
grep -E "test result: .*[1-9][0-9]* passed|FAILED|panicked" $D/gpu_tests.log | sort | uniq -c >> $L
t wait-checkpoint
wait $CK; tail -2 /tmp/ckpt.log >> $L
ab() {  # ab NAME BINARY REVISION
  timeout 90 $2 bench --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --lengths 139,712,15446 --batch-sizes 32,128 --batch-prompt-tokens 300 --hardware "$HW" --revision $3 \
    --runs 20 --batch-runs 5 --warmup 3 --out $D/ab_$1.json > $D/ab_$1.log 2>&1
  echo "$1 exit $?" >> $L
}
for round in 1 2; do
  t "round $round"
  ab base$round .carry/bin/instinct-base $BASE
  ab new$round .carry/bin/instinct $REV
done
for V in new base; do
  BIN=.carry/bin/instinct; [ $V = base ] && BIN=.carry/bin/instinct-base
  t "parity $V"
  timeout 150 $BIN check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
    --out $D/check_$V.json > $D/check_$V.log 2>&1; echo "check $V exit $?" >> $L
  grep -E "questions on|PASS|FAIL|Error" $D/check_$V.log >> $L
done
python3 - "$D" >> $L <<'PY'
import glob, json, os, sys
d = sys.argv[1]
for f in sorted(glob.glob(os.path.join(d, "ab_*.json"))):
    r = json.load(open(f))
    lat = {x["name"]: round(x["median_ms"], 3) for x in r.get("latency", [])}
    bat = {x["name"]: round(x.get("tokens_per_s", 0)) for x in r.get("batch", [])}
    print(os.path.basename(f), lat, bat)
def probs(f):
    r = json.load(open(f)); return {(q["prompt"], q["ids"], q["n_options"]): q["p"] for q in r["rows"]}
try:
    a, b = probs(os.path.join(d, "check_new.json")), probs(os.path.join(d, "check_base.json"))
    diffs = [max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a if k in b and a[k] and b[k]]
    print("parity new vs base: questions", len(diffs), "max |dp|", max(diffs) if diffs else None)
except Exception as e:
    print("parity diff failed:", e)
PY
t done
tar -czf $OUT/$NAME.tar.gz -C /tmp $NAME
