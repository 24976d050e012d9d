# Sourced by the cluster-engine tests (tests/test_engine_*.sh), which define fail().
#
#   kill_member_when_training OUT LOG NAME=VALUE PATTERN
#
# Kills with SIGKILL the process of the job writing to OUT whose environment holds NAME=VALUE
# (the engine's rank variable), once LOG matches PATTERN (the job trains); fails after five
# minutes, a bound for a job that never trains rather than a pace.
kill_member_when_training() {
  local out=$1 log=$2 identity=$3 pattern=$4 victim="" pid
  for _ in $(seq 3000); do
    if grep -q "$pattern" "$log" 2>/dev/null; then
      for pid in $(pgrep -f "$out" || true); do
        tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "$identity" && victim=$pid
      done
    fi
    [[ -n $victim ]] && break
    sleep 0.1
  done
  [[ -n $victim ]] || fail "the job in $out did not train within five minutes"
  kill -9 "$victim"
}
