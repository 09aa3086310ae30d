# Sourced by setup_example.sh and run_example.sh: load CANN's environment as the image provides it.
# ASCEND_SET_ENV names the script (a rehearsal points it at the simulated NPU's simnpu/cann/set_env.sh); else
# the first of CANN 8.5+'s /usr/local/Ascend/cann/set_env.sh and the older .../ascend-toolkit/set_env.sh.
if [[ -z "${ASCEND_SET_ENV:-}" ]]; then
  for candidate in /usr/local/Ascend/cann/set_env.sh /usr/local/Ascend/ascend-toolkit/set_env.sh; do
    if [[ -f "$candidate" ]]; then ASCEND_SET_ENV="$candidate"; break; fi
  done
fi
if [[ -z "${ASCEND_SET_ENV:-}" || ! -f "$ASCEND_SET_ENV" ]]; then
  echo "CANN's set_env.sh not found (${ASCEND_SET_ENV:-/usr/local/Ascend/cann/set_env.sh, .../ascend-toolkit/set_env.sh}):" \
       "run on a CANN image, or set ASCEND_SET_ENV to its path" >&2
  exit 1
fi
echo "CANN environment: $ASCEND_SET_ENV"
# set_env.sh scripts read unset variables; source it outside `set -u`.
set +u
# shellcheck disable=SC1090
source "$ASCEND_SET_ENV"
set -u
