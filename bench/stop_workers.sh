#!/usr/bin/env bash
# Stop the grid workers (bench/card_envs_grid.sh, bench/protocol_grid.sh) without losing what their runs did since
# their last checkpoint: the end of a working session, or a queue to reorder. Every process of a worker's process
# group (each worker is started with setsid) gets SIGUSR1: the worker script ends (bash's default for that signal),
# and each bench/continual.py run saves a checkpoint at its next rollout start and stops (bench/run_checkpoint.py;
# a run that is writing its tables finishes them). What is still running after TIMEOUT seconds gets SIGTERM (it
# resumes from its last periodic checkpoint, at most 10 minutes old).
#
#     bench/stop_workers.sh [TIMEOUT_SECONDS] [PATTERN]
#
# PATTERN (an extended regular expression for `pgrep -f`) names the workers' scripts. Then commit the runs and the
# checkpoints (the command in bench/card_envs_grid.sh's header).
set -u
TIMEOUT=${1:-300}
PATTERN=${2:-"card_envs_grid[.]sh|protocol_grid[.]sh"}
groups=$(for pid in $(pgrep -f "$PATTERN"); do ps -o pgid= -p "$pid"; done | tr -d ' ' | sort -u)
if [ -z "$groups" ]; then
    echo "no worker running (pgrep -f '$PATTERN')"
    exit 0
fi
echo "$(date -u +%T) asking the process groups $(echo $groups) to checkpoint and stop (SIGUSR1)"
# every process of the groups but multiprocessing's resource tracker (a pool's helper: the signal would end it, and
# it ends by itself with its pool)
for g in $groups; do
    for pid in $(ps -e -o pgid=,pid=,args= | awk -v g="$g" '$1 == g && !/multiprocessing.resource_tracker/ {print $2}'); do
        kill -USR1 "$pid" 2>/dev/null
    done
done
deadline=$((SECONDS + TIMEOUT))
while :; do
    alive=""
    # a process of the group that is not a zombie (one that has ended but is not yet reaped by its parent)
    for g in $groups; do
        ps -e -o pgid=,stat= | awk -v g="$g" '$1 == g && $2 !~ /^Z/ {found = 1} END {exit !found}' && alive="$alive $g"
    done
    if [ -z "$alive" ]; then
        echo "$(date -u +%T) every worker stopped"
        exit 0
    fi
    [ $SECONDS -ge $deadline ] && break
    sleep 1
done
echo "$(date -u +%T) still running after ${TIMEOUT} s, ended with SIGTERM:$alive"
for g in $alive; do kill -TERM -- "-$g" 2>/dev/null; done
exit 1
