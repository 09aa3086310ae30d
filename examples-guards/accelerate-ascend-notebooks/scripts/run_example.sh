#!/usr/bin/env bash
# Ascend's examples guard: run one manifest entry, examples/NN_slug.sh (one notebook through `python -m nbtools
# run`), with the report in $CI_OUTPUT_DIR/report and its result.json copied to $CI_OUTPUT_DIR/result.json.
#   TARGET_ROOT=<checkout> CI_OUTPUT_DIR=<folder> [OVERLAY_ARGS='["--simulate-npu"]'] bash scripts/run_example.sh examples/02_distributed_eval.sh
# It reads what the guard's run step exports (Ascend/docs .github/workflows/examples-template.yml): OVERLAY_ARGS, a
# JSON array of strings, each expanded (${VAR}) and shell-split, appended to nbtools run's arguments; EXAMPLE_SOURCE
# (upstream: the path is in TARGET_ROOT; project: in this guard folder); EXEC (a file to run instead of the path);
# LAUNCHER (none here: the notebooks start their own ranks). EXAMPLE_PATH and PROFILE are not needed ($1 is the path).
# result.json names the entry (path), its source, the repository and commit of TARGET_ROOT's git checkout, and the
# image the manifest gives this entry (the guard exports none); the guard itself keeps only the job log (the
# verdict table nbtools run prints) and the exit status: nbtools run's, 0 only when every check of the notebook
# passed or was skipped with its reason.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 <example-relpath>" >&2
  exit 2
fi
EXAMPLE_REL="$1"
TARGET_ROOT="$(cd "${TARGET_ROOT:?TARGET_ROOT is required: the checkout of the series repository}" && pwd)"
CI_OUTPUT_DIR="${CI_OUTPUT_DIR:?CI_OUTPUT_DIR is required}"
HERE="$(cd "$(dirname "$0")" && pwd)"
if [[ -n "${LAUNCHER:-}" ]]; then
  echo "launcher '$LAUNCHER' is not one this project runs: each notebook starts its own ranks (%launch); leave launcher out of the entry" >&2
  exit 2
fi
case "${EXAMPLE_SOURCE:-upstream}" in
  upstream) BASE="$TARGET_ROOT" ;;
  project) BASE="$(cd "$HERE/.." && pwd)" ;;
  *) echo "EXAMPLE_SOURCE must be upstream or project, got '$EXAMPLE_SOURCE'" >&2; exit 2 ;;
esac
LAUNCH_PATH="$BASE/${EXEC:-$EXAMPLE_REL}"
if [[ ! -f "$LAUNCH_PATH" ]]; then
  echo "launchable file not found: $LAUNCH_PATH" >&2
  exit 1
fi
mkdir -p "$CI_OUTPUT_DIR"
CI_OUTPUT_DIR="$(cd "$CI_OUTPUT_DIR" && pwd)"
source "$HERE/cann_env.sh"
PYTHON="$(command -v python3 || command -v python)"

overlay="$("$PYTHON" - <<'PY'
import json, os, shlex
raw = os.environ.get("OVERLAY_ARGS", "").strip()
items = json.loads(raw) if raw and raw != "null" else []
if not isinstance(items, list) or not all(isinstance(i, str) and i.strip() for i in items):
    raise SystemExit(f"OVERLAY_ARGS must be a JSON array of non-empty strings, got {raw!r}")
print(" ".join(shlex.quote(t) for i in items for t in shlex.split(os.path.expandvars(i))))
PY
)"
eval "extra=( $overlay )"

# result.json's fields (nbtools/report.py, result_record): what this job can state, never a guess
export RESULT_PATH="$EXAMPLE_REL" RESULT_SOURCE="${EXAMPLE_SOURCE:-upstream}"
if [[ -z "${RESULT_IMAGE:-}" ]]; then  # the manifest's image for this path (of several, the one of this Python)
  RESULT_IMAGE="$("$PYTHON" - "$HERE/../examples_manifest.yaml" "$EXAMPLE_REL" <<'PY' || true
import sys, yaml
entries = yaml.safe_load(open(sys.argv[1], encoding="utf-8")).get("supported") or []
images = sorted({e["image"] for e in entries if e.get("path") == sys.argv[2] and e.get("image")})
images = images if len(images) < 2 else [i for i in images if i.endswith("-py%d.%d" % sys.version_info[:2])]
print(images[0] if len(images) == 1 else "")
PY
)"
  [[ -z "$RESULT_IMAGE" ]] || export RESULT_IMAGE
fi
if git -C "$TARGET_ROOT" rev-parse HEAD >/dev/null 2>&1; then
  RESULT_TARGET_REF="${RESULT_TARGET_REF:-$(git -C "$TARGET_ROOT" rev-parse HEAD)}"
  origin="$(git -C "$TARGET_ROOT" remote get-url origin 2>/dev/null || true)"
  if [[ "$origin" =~ github\.com[:/]([^/]+/[^/]+)$ ]]; then
    RESULT_TARGET_REPO="${RESULT_TARGET_REPO:-${BASH_REMATCH[1]%.git}}"
  fi
  export RESULT_TARGET_REF RESULT_TARGET_REPO
fi

echo "running $EXAMPLE_REL (${#extra[@]} overlay args) -> $CI_OUTPUT_DIR"
status=0
(cd "$TARGET_ROOT" && bash "$LAUNCH_PATH" --output "$CI_OUTPUT_DIR/report" "${extra[@]}") || status=$?
if [[ -f "$CI_OUTPUT_DIR/report/result.json" ]]; then
  cp "$CI_OUTPUT_DIR/report/result.json" "$CI_OUTPUT_DIR/result.json"
else
  echo "no result.json in $CI_OUTPUT_DIR/report: nbtools run ended before its report (exit $status)" >&2
  [[ $status -ne 0 ]] || status=1
fi
exit "$status"
