#!/usr/bin/env bash
# bench/continual.py runs on a lent device machine's CPU cores (16 there against this machine's 2): the short,
# independent ones, fresh agents (`--fresh-only`), which end inside one device call (a call has 10 minutes at most,
# a session 15 minutes of device time in all; a continual run of ~50 CPU-minutes would not). The GPU is not used.
#
#     bench/device_runs.sh LIMIT_SECONDS <bench/continual.py arguments>
#
# through the device tool, with the wheels of `bench/gpu_session.sh --download-wheels` carried:
#     run(command="bench/device_runs.sh 420 --setting minatar_intensive --methods plastic_relu ... --seeds 1 2 3 4
#                  --fresh sample --fresh-only --jobs 16", carry=[".whl"], timeout_s=560)
# After LIMIT_SECONDS the runs still going are stopped, their process group only (lost: fresh agents keep no
# checkpoint); every run JSON the call wrote in its output folder comes back in $OUT/runs.tgz (paths relative to the
# repository root: `tar xzf runs.tgz` there adds them), the transcript in $OUT/session.log. The JSONs record the
# torch build that trained them ("torch").
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:?usage: bench/device_runs.sh LIMIT_SECONDS <bench/continual.py arguments>}
shift
OUT="${OUT:-/tmp/device_runs}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
PYTHON="${PYTHON:-python3}"   # the interpreter (the tests pass their own)
PY="$PYTHON -P"   # -P for the install checks: the checkout's sb3_plastic/ must not shadow the installed package
exec > >(tee -a "$OUT/session.log") 2>&1
echo "=== $(date -u +%T) environment"
source bench/device_env.sh
marker=$(mktemp)
echo "=== $(date -u +%T) bench/continual.py $* (stopped after ${LIMIT} s)"
# a script's own folder (bench/) leads sys.path, the checkout root does not: the installed sb3_plastic is imported.
# The runs get their own process group (setsid), so that stopping them stops their pool processes and nothing else
# on the machine (a `pkill -f` here once stopped another checkout's grid workers).
setsid "$PYTHON" bench/continual.py "$@" --no-diagnostics-plots &
runs=$!
# the watchdog's sleep must not outlive it: an orphaned sleep kept the script's output open, so the caller (the device
# tool, a test) waited out the whole limit after the runs had ended; its output goes nowhere, and stopping the
# watchdog stops its sleep (the trap)
( trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  sleep "$LIMIT" & nap=$!
  wait "$nap" && { touch "$marker.limit"; kill -- -"$runs" 2>/dev/null; } ) > /dev/null 2>&1 &
watchdog=$!
wait "$runs"
code=$?
if [ -e "$marker.limit" ]; then
    echo "=== $(date -u +%T) runs stopped at the ${LIMIT} s limit (those unfinished are lost); packing the run JSONs written"
else
    echo "=== $(date -u +%T) runs finished (exit $code); packing the run JSONs written"
fi
rm -f "$marker.limit"
kill "$watchdog" 2>/dev/null
kill -- -"$runs" 2>/dev/null   # pool processes still going after a stop
# the call's output folder, as bench/continual.py names it (--out, else bench/results/continual/<setting>[_quick]):
# only its runs are packed, not what other processes write elsewhere meanwhile
folder="" setting=bandit quick="" prev=""
for a in "$@"; do
    case $prev in --out) folder=$a ;; --setting) setting=$a ;; esac
    [ "$a" = --quick ] && quick=_quick
    prev=$a
done
folder=${folder:-bench/results/continual/$setting$quick}
find "$folder" -path '*/runs/*' -name '*.json' -newer "$marker" 2>/dev/null | sort | tee "$OUT/written.txt" \
    | tar czf "$OUT/runs.tgz" -T -
echo "$(wc -l < "$OUT/written.txt") run JSONs in runs.tgz"
