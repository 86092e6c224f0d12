#!/usr/bin/env bash
# The project's test command (README.md): installs the public Qwen3.5 vocabulary the tokenizer tests
# need (once) and NVRTC + the CUDA headers the kernel compile test needs (once), then runs every
# test that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/fetch-qwen-vocab.sh
tools/fetch-cuda-headers.sh
cargo test --workspace "$@"
