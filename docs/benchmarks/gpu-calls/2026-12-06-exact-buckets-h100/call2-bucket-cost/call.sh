#!/usr/bin/env bash
# Call 2 (binary of 99b9d07): tools/reference/gemm_bucket_cost.sh with its default rows, 2 tries.
export REV=99b9d07; source tools/reference/gpu_call.sh; start_checkpoint; wait_checkpoint
OUT=$OUT/bucket timeout 400 bash tools/reference/gemm_bucket_cost.sh
