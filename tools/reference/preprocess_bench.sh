#!/usr/bin/env bash
# Screenshot preprocessing time per stage (header check + decode, smart resize, normalize +
# patches), fastest of 41 runs per image (the least disturbed on a shared machine), on the committed test images that the serving limits
# take (up to 1024x1024). Runs on the CPU: the GPU server preprocesses on its CPU pool.
#
#   tools/reference/preprocess_bench.sh [OUT.tsv]
#
# Prints a tab-separated table (and writes it to OUT.tsv when given) with the host and revision.
set -euo pipefail
cd "$(dirname "$0")/../.."
I=model/tests/data/images
IMAGES=(png_rgb_1024x1024.png png_rgb_1040x736.png png_rgba_1040x736.png png_palette_1040x736.png
        png_gray_1040x736.png jpeg_rgb_1040x736.jpg jpeg_rgb_640x480.jpg png_rgb_320x240.png)
cargo build --release -q -p instinct-model --example preprocess_time
{
    echo "# revision $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- model || echo +dirty)," \
         "$(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
    target/release/examples/preprocess_time "${IMAGES[@]/#/$I/}"
} | tee "${1:-/dev/null}"
