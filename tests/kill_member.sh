# Sourced by the cluster-engine tests (tests/test_engine_*.sh) and tests/test_examples.sh, which
# define fail().
#
#   kill_member_when_training OUT LOG NAME=VALUE PATTERN
#   kill_member_once OUT NAME=VALUE COMMAND...
#
# Kills with SIGKILL the process of the job writing to OUT whose environment holds NAME=VALUE
# (the engine's rank variable, or weft launch's), once LOG matches PATTERN (the job trains), or
# once COMMAND succeeds; fails after five minutes, a bound for a job that never gets there rather
# than a pace.
kill_member_once() {
  local out=$1 identity=$2 victim="" pid
  shift 2
  for _ in $(seq 3000); do
    if "$@"; then
      for pid in $(pgrep -f "$out" || true); do
        tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "$identity" && victim=$pid
      done
    fi
    [[ -n $victim ]] && break
    sleep 0.1
  done
  [[ -n $victim ]] || fail "the job in $out did not get where a member is killed within five minutes"
  kill -9 "$victim"
}

kill_member_when_training() {
  kill_member_once "$1" "$3" grep -qs "$4" "$2"
}
