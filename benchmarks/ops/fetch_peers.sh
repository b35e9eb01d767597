#!/usr/bin/env bash
# Recreate .peer/site: the pure-Triton SSD ops of mamba-ssm (peer of `python -m benchmarks.ops ssd`),
# importable without building mamba-ssm's CUDA extensions, plus the pure-Python packages they import.
# The GPU machine has no network: run this here, then name ".peer" in the device call's carry list and
# put "$PWD/.peer/site" on PYTHONPATH there (as the callers of benchmarks/ops/gpu_check.sh do).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '.peer/' .git/info/exclude 2>/dev/null || echo '.peer/' >> .git/info/exclude
tmp=$(mktemp -d)
# the sdist's metadata step imports torch (the project venv has it) and builds CUDA code unless told not to
MAMBA_SKIP_CUDA_BUILD=TRUE "${PYTHON:-.venv/bin/python}" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
  -d "$tmp" mamba-ssm==2.3.2.post1 2>/dev/null || ls "$tmp"/mamba_ssm-*.tar.gz >/dev/null
tar -xzf "$tmp"/mamba_ssm-*.tar.gz -C "$tmp"
rm -rf .peer/site && mkdir -p .peer/site/mamba_ssm  # (torch, triton, packaging are on the device)
cp -r "$tmp"/mamba_ssm-*/mamba_ssm/ops "$tmp"/mamba_ssm-*/mamba_ssm/utils .peer/site/mamba_ssm/
echo '"""Stub: only the pure-Triton ops are used (the real __init__ imports CUDA extensions)."""' > .peer/site/mamba_ssm/__init__.py
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$tmp/w" einops==0.8.2
for w in "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" .peer/site; done
rm -rf "$tmp"
du -sh .peer
