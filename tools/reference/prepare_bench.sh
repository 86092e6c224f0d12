#!/usr/bin/env bash
# Request preparation time per question, single-threaded (chat template render + tokenization of
# each of the 60 real fixture questions; fastest of ROUNDS runs per question), with the built-in
# rendering and the tiny checkpoints' Jinja template, the tokenizer's piece cache warm and cold,
# the chat encoded whole and with the system turn's ids cached. Runs on the CPU: the server
# prepares on its CPU pool.
#
#   tools/reference/prepare_bench.sh [ROUNDS] [OUT.tsv]
#
# Needs the vocabulary (tools/fetch-qwen-vocab.sh) and the fixtures (../shared/fixtures or
# $INSTINCT_FIXTURES). Prints a tab-separated table (and writes it to OUT.tsv when given) with the
# host and revision.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p instinct-model --example prepare_timing
{
    echo "# revision $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- model || echo +dirty)," \
         "$(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    target/release/examples/prepare_timing "${1:-41}"
} | tee "${2:-/dev/null}"
