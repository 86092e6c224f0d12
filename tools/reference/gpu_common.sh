# Shared by the GPU call scripts (gpu_bench.sh, gpu_load.sh); sourced, not run.

# The background `instinct serve` of a script, stopped (SIGTERM, then waited for) on exit.
server_pid=
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" || true
    wait "$server_pid" || true
  fi
  server_pid=
}
trap stop_server EXIT

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
