#!/usr/bin/env bash
# The project's test command (README.md): installs the public Qwen3.5 vocabulary the tokenizer tests
# need (once), NVRTC + the CUDA headers the kernel compile test needs (once) and the system packages
# other tests run (Prometheus; once, as root or through sudo), then runs every test that needs no
# GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/fetch-qwen-vocab.sh
tools/fetch-cuda-headers.sh
tools/install-test-deps.sh
cargo test --workspace "$@"
