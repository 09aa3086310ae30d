#!/usr/bin/env bash
# Ascend's examples guard: prepare the image for one profile of examples_manifest.yaml.
#   TARGET_ROOT=<checkout of this repository> bash scripts/setup_example.sh notebooks|notebooks-deepspeed
# It installs as a learner on that image does (README.zh-CN.md): tools/install.py holds the image's torch and
# torch_npu at their versions, installs the series' requirements and nbtools around them, and checks afterwards
# that they did not change. With --npu, an image with neither torch nor torch_npu gets the quick-start's pair
# (requirements-npu.txt: torch 2.9.0, on x86_64 2.9.0+cpu from PyTorch's CPU index; torch_npu 2.9.0.post2), one with torch alone the torch_npu of that torch (or,
# where pip finds none, one sentence and a failed step). Then `python -m nbtools doctor` says what the image is.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 <profile>   (notebooks | notebooks-deepspeed)" >&2
  exit 2
fi
PROFILE="$1"
TARGET_ROOT="${TARGET_ROOT:?TARGET_ROOT is required: the checkout of the series repository}"
HERE="$(cd "$(dirname "$0")" && pwd)"

case "$PROFILE" in
  notebooks) extra=() ;;
  notebooks-deepspeed) extra=(-r "$TARGET_ROOT/requirements-deepspeed.txt") ;;  # 08's ZeRO-3 section
  *) echo "unknown profile: $PROFILE (supported: notebooks notebooks-deepspeed)" >&2; exit 1 ;;
esac

source "$HERE/cann_env.sh"
PYTHON="$(command -v python3 || command -v python)"
"$PYTHON" "$TARGET_ROOT/tools/install.py" --npu -c "$HERE/../constraints-npu.txt" -r "$TARGET_ROOT/requirements.txt" "${extra[@]}"
# doctor's answer is part of the log; a problem it reports fails the notebook's setup cell, not this step
"$PYTHON" -m nbtools doctor || echo "nbtools doctor reported a problem (above); the notebooks' setup cells say it too"
