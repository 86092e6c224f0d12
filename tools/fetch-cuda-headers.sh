#!/usr/bin/env bash
# Installs NVRTC and the CUDA headers its kernels include (cuda_bf16.h, mma.h, ...) from NVIDIA's
# PyPI wheels into <repo>/.cache/cuda/{lib,include}, so CI can compile every kernel without a GPU,
# a driver or a CUDA toolkit. Idempotent and quiet when the pinned versions are already there.
# kernels/tests/nvrtc_compile.rs reads this fixed path (no env needed).
set -euo pipefail
cd "$(dirname "$0")/.."

# CUDA 13.0, the toolkit of the GPU machines (the NVRTC version must not be newer than the driver).
WHEELS=(
    "nvidia-cuda-nvrtc==13.0.88"
    "nvidia-cuda-runtime==13.0.96"
    "nvidia-cuda-crt==13.0.88"
)
DEST=.cache/cuda
STAMP="$DEST/.installed"
# The stamp names the wheels and the layout version, so changing either reinstalls.
WANT="layout-3 ${WHEELS[*]}"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -f "$DEST/lib/libnvrtc.so.13" \
      && -f "$DEST/include/cuda_bf16.h" && -f "$DEST/include/crt/mma.h" ]]; then
    exit 0
fi

PYTHON="${PYTHON:-python3}"
DOWNLOAD="$(mktemp -d)"
trap 'rm -rf "$DOWNLOAD"' EXIT
echo "fetch-cuda-headers: downloading ${WANT}" >&2
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$DOWNLOAD" "${WHEELS[@]}"

# Unpack into a fresh directory next to the destination, then swap it in, so an interrupted run
# never leaves a half-filled cache that the stamp check would accept.
STAGING="$DEST.partial"
rm -rf "$STAGING"
mkdir -p "$STAGING"
"$PYTHON" - "$DOWNLOAD" "$STAGING" <<'PY'
import pathlib, sys, zipfile

src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
prefix = "nvidia/cu13/"
for wheel in sorted(src.glob("*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(prefix):
                continue
            rel = info.filename[len(prefix):]
            # Headers, and NVRTC itself (libnvrtc + its builtins); not the runtime static libraries, nor
            # the ".alt" NVRTC build, which nothing loads.
            if not (rel.startswith("include/") or (rel.startswith("lib/libnvrtc") and ".alt." not in rel)):
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(zf.read(info))
PY
echo "$WANT" >"$STAGING/.installed"
rm -rf "$DEST"
mv "$STAGING" "$DEST"
echo "fetch-cuda-headers: installed into $DEST" >&2
