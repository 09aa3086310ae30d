#!/usr/bin/env bash
# Runs notebooks/07c_lora_evaluate_and_keep.ipynb unattended: python -m nbtools run, report.json, result.json and index.html in the
# --output folder. Further arguments go to nbtools run (--output DIR, --simulate-npu, -p NAME=VALUE).
exec python -m nbtools run "$(dirname "$0")/../notebooks/07c_lora_evaluate_and_keep.ipynb" "$@"
