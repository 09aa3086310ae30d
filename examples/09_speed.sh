#!/usr/bin/env bash
# Runs notebooks/09_speed.ipynb unattended: python -m nbtools run, report.json, result.json and index.html in the
# --output folder. Further arguments go to nbtools run (--output DIR, --simulate-npu, -p NAME=VALUE).
exec python -m nbtools run "$(dirname "$0")/../notebooks/09_speed.ipynb" "$@"
