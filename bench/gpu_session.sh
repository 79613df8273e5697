#!/usr/bin/env bash
# The GPU checks of issue #16 and the CUDA tests, as one command for a lent GPU machine (device `run`).
#
# A lent machine has torch with CUDA but none of SB3 / gymnasium / MinAtar / ale-py: they travel as wheels. Once,
# on the development machine, in the repository root (Python 3.12 wheels for the device's python3):
#
#     bench/gpu_session.sh --download-wheels          # into .whl/ (git-ignored through .git/info/exclude), ~4 MB
#
# then, through the device tool: run(command="bench/gpu_session.sh", carry=[".whl"], timeout_s=600).
# Stages, each under its own `timeout` so the whole command ends inside ~8 minutes (a lease has 15 minutes of
# device time, the machine's start included); the likeliest to overrun (torch.compile) comes last:
#   1. install the wheels and this package (no network, no dependencies resolved)
#   2. the CUDA tests (tests/test_cuda.py and the tests named *cuda* / *gpu* elsewhere; pytest's -k ignores case)
#   3. bench/step_cost.py --device cuda over the entries that carry a target (wall clock, synchronised)
#   4. bench/step_cost.py --device cuda --whole-run over PPO MinAtar ReLU + AdamO and MaxMin + AdamO (fps ratios)
#   5. bench/maxmin_paths.py --device cuda
#   6. bench/step_cost.py --device cuda --compile all over three train-step entries
# The transcript (session.log) and the four JSONs go to $OUT (bench/results/step_cost/gpu_<date>/ when OUT is unset).
#
# A lease of 15 minutes held part 1 of these stages at most (the twentieth session: stages 3-6 ran out of their
# timeouts), so `bench/gpu_session.sh --part 2` runs what part 1 leaves: the CUDA test that needs rliable, the SAC
# and DQN-Nature-auto train-step entries, MaxMin's whole run, the MLP shapes of maxmin_paths and torch.compile of the
# two other entries (~5 minutes). `--part 1` (the default) runs stages 2-6 as listed above.
#
# SB3P_GPU_DEVICE=cpu SB3P_GPU_QUICK=1 bench/gpu_session.sh runs the same stages here at toy size (a smoke check of
# the script itself; its numbers mean nothing).
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(stable-baselines3==2.9.2 sb3-contrib==2.9.2 gymnasium==1.4.0 farama-notifications==0.0.6 minatar==1.0.15
        ale-py==0.12.1 arch==7.2.0)

if [ "${1:-}" = "--download-wheels" ]; then
    mkdir -p .git/info .whl
    grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}" || exit
    # rliable (the bench's statistics, read by bench/continual.py's report) has no wheel on the index: built here
    exec python3 -m pip wheel -q --no-deps -w .whl rliable==1.2.0
fi

PART=1
[ "${1:-}" = "--part" ] && PART="${2:-1}"
DEVICE="${SB3P_GPU_DEVICE:-cuda}"
QUICK="${SB3P_GPU_QUICK:-0}"
OUT="${OUT:-bench/results/step_cost/gpu_$(date -u +%Y-%m-%d)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
PY="python3 -P"   # -P: the checkout's sb3_plastic/ (without envs/ mapped in) must not shadow the installed package

exec > >(tee -a "$OUT/session.log") 2>&1   # the whole transcript; the tool's reply holds only its tail

stage() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }

stage "1. environment"
source bench/device_env.sh   # the wheels and this package

if [ "$QUICK" = 1 ]; then
    ROUNDS=(--rounds 2 --min-run-time 0.01); ENTRIES=(dqn-mlp-relu); COMPILED=(dqn-mlp-relu); SHAPES=(--only 1 7)
    TESTS=(tests/test_bench_maxmin_paths.py -k gpu); WHOLE=(--whole-run 256 --only dqn-mlp-relu)
else
    ROUNDS=(--rounds 3 --min-run-time 0.3)
    ENTRIES=(ppo-minatar-relu ppo-minatar-auto ppo-minatar-maxmin ppo-minatar-maxmin-forward ppo-nature-relu
             ppo-nature-auto dqn-mlp-relu dqn-mlp-auto dqn-nature-relu dqn-nature-auto sac-mlp-relu sac-mlp-auto
             sac-mlp-maxmin)
    COMPILED=(ppo-minatar-relu ppo-nature-relu sac-mlp-relu)
    SHAPES=()
    TESTS=(tests/test_cuda.py tests/test_isometry_core.py tests/test_regularisers.py tests/test_bench_continual_protocol.py
           tests/test_save_plastic_state_device.py tests/test_shrink_perturb_rng.py tests/test_bench_maxmin_paths.py
           -k "cuda or gpu")
    WHOLE=(--whole-run 16384 --only ppo-minatar-relu ppo-minatar-maxmin)
fi
if [ "$QUICK" != 1 ] && [ "$PART" = 2 ]; then
    ROUNDS=(--rounds 3 --min-run-time 0.2)
    ENTRIES=(sac-mlp-relu sac-mlp-auto sac-mlp-maxmin dqn-nature-auto)
    WHOLE=(--whole-run 8192 --only ppo-minatar-maxmin)
    SHAPES=(--only 4 7 8 9)
    COMPILED=(sac-mlp-relu)
    TESTS=(tests/test_bench_continual_protocol.py -k "cuda or gpu")
fi
echo "part $PART"
T=(90 150 90 40 90)                     # each stage's timeout, seconds
[ "$PART" = 2 ] && T=(60 100 60 40 60)

stage "2. CUDA tests"
timeout ${T[0]} $PY -m pytest -q -p no:cacheprovider -p no:randomly -rs "${TESTS[@]}"

stage "3. step_cost --device $DEVICE"
timeout ${T[1]} $PY bench/step_cost.py --device "$DEVICE" "${ROUNDS[@]}" --only "${ENTRIES[@]}" \
    --json "$OUT/step_cost.json"

stage "4. step_cost --device $DEVICE ${WHOLE[*]}"
timeout ${T[2]} $PY bench/step_cost.py --device "$DEVICE" --rounds 3 "${WHOLE[@]}" --json "$OUT/whole_run.json"

stage "5. maxmin_paths --device $DEVICE"
timeout ${T[3]} $PY bench/maxmin_paths.py --device "$DEVICE" --rounds 3 --min-run-time 0.1 "${SHAPES[@]}" \
    --json "$OUT/maxmin_paths.json"

stage "6. step_cost --device $DEVICE --compile all"
timeout ${T[4]} $PY bench/step_cost.py --device "$DEVICE" "${ROUNDS[@]}" --only "${COMPILED[@]}" --compile all \
    --json "$OUT/step_cost_compile.json"

stage "done"
ls -la "$OUT"
