#!/usr/bin/env bash
# Fuzzes one target of `instinct-fuzz` with AFL++ (cargo-afl, stable toolchain) from the committed
# corpus, then minimizes the corpus plus everything the run found back into fuzz/corpus/TARGET.
#
#   tools/fuzz.sh TARGET [SECONDS]       targets: request_body image chat_template tokenizer problem_body
#
# SECONDS defaults to 600; 0 only minimizes the corpus with what the last run found.
#
# Needs `cargo install cargo-afl` and `cargo afl config --build` once, and the Qwen3.5 vocabulary
# (tools/fetch-qwen-vocab.sh). Environment:
#   FUZZ_OUT         AFL++ output directories, one per target (default fuzz/out, git-ignored);
#                    an existing one is resumed
#   FUZZ_TARGET_DIR  cargo target directory of the instrumented build (default fuzz/afl/target)
#   FUZZ_NO_CMIN=1   leave fuzz/corpus/TARGET as it is after the run
# Runs at nice 19 without CPU binding, so it never slows other work on the machine.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${1:?usage: tools/fuzz.sh TARGET [SECONDS]}"
seconds="${2:-600}"
case "$target" in
    request_body) dict="request_body.dict"; timeout_ms=3000 ;;
    image) dict="image.dict"; timeout_ms=5000 ;;
    chat_template | tokenizer) dict="text.dict"; timeout_ms=3000 ;;
    problem_body) dict=""; timeout_ms=1000 ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
esac

out="${FUZZ_OUT:-$repo/fuzz/out}/$target"
corpus="$repo/fuzz/corpus/$target"
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$repo/fuzz/afl/target}"
bin="$CARGO_TARGET_DIR/release/$target"

(cd "$repo/fuzz/afl" && nice -n 19 cargo afl build --release --locked --bin "$target")

export AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_AUTORESUME=1
# The harness loads the tokenizer before the fork server starts (a few seconds).
export AFL_FORKSRV_INIT_TMOUT=60000
mkdir -p "$(dirname "$out")"
dict_args=()
[[ -n "$dict" ]] && dict_args=(-x "$repo/fuzz/dict/$dict")
# SECONDS 0 only minimizes the corpus with what the last run in $out found.
if [[ "$seconds" -gt 0 ]]; then
    echo "fuzzing $target for ${seconds}s into $out"
    nice -n 19 cargo afl fuzz -V "$seconds" -t "$timeout_ms" "${dict_args[@]}" \
        -i "$corpus" -o "$out" -- "$bin" >>"$out.log" 2>&1 || {
        echo "afl-fuzz failed; see $out.log" >&2
        tail -20 "$out.log" >&2
        exit 1
    }
fi

stats="$out/default/fuzzer_stats"
grep -E '^(run_time|execs_done|execs_per_sec|corpus_count|bitmap_cvg|edges_found|total_edges|saved_crashes|saved_hangs|stability) ' "$stats"
crashes=("$out"/default/crashes/id:* "$out"/default/hangs/id:*)
found=0
for c in "${crashes[@]}"; do
    [[ -e "$c" ]] && { echo "FOUND: $c"; found=1; }
done

if [[ "${FUZZ_NO_CMIN:-0}" != 1 ]]; then
    # Minimize the committed corpus and the run's queue together; crashing inputs are left out
    # (they become regression inputs once fixed).
    pool="$(mktemp -d)"
    trap 'rm -rf "$pool"' EXIT
    cp "$corpus"/* "$pool/"
    cp "$out"/default/queue/id:* "$pool/" 2>/dev/null || true
    # afl-cmin's first run of the binary includes the tokenizer's start-up: allow for it. Edge
    # coverage alone (-e, hit counts ignored) keeps the committed corpus small.
    nice -n 19 cargo afl cmin -e -t 60000 -i "$pool" -o "$pool.min" -- "$bin" >"$out.cmin.log" 2>&1 || {
        echo "afl-cmin failed; see $out.cmin.log" >&2
        tail -5 "$out.cmin.log" >&2
        exit 1
    }
    rm -rf "$corpus"
    mkdir -p "$corpus"
    # Content-addressed names: stable across runs, no AFL bookkeeping in the file names.
    for f in "$pool.min"/*; do
        install -m 644 "$f" "$corpus/$(sha256sum "$f" | cut -c1-16)"
    done
    rm -rf "$pool.min"
    echo "corpus: $(ls "$corpus" | wc -l) files, $(du -sh "$corpus" | cut -f1)"
fi
exit "$found"
