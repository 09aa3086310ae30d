# The simulated NPU's stand-in for CANN's set_env.sh: it exports the variables libraries read (as the real one
# does, pointing at the CANN home) and nothing else. Used by the examples-guard rehearsal (README, ci:examples-guard).
_simnpu_cann="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export ASCEND_HOME_PATH="$_simnpu_cann" ASCEND_TOOLKIT_HOME="$_simnpu_cann"
unset _simnpu_cann
