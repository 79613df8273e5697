#!/usr/bin/env bash
# The cheap arms of issues #27, #29 and #30 under issue #14's protocol (5 seeds, fresh agents) on the random-label
# bandit and PerturbedCartPole, then issue #29's Gym-control grid, one method at a time so each arm completes, in
# the order the issues need them. One worker beside the card's-environments grid (bench/card_envs_grid.sh, one
# worker on a 2-core machine: two runs at once, one per core): this list costs ~1.5-5 CPU-min per (method, seed) on
# the toy settings, ~45-65 on the Gym-control ones, the card's grid ~50-600.
#     nohup setsid bench/protocol_grid.sh > /tmp/protocol.log 2>&1 &
# bench/continual.py skips what is finished and reports what another worker holds, so the list can be rerun.
# Stop it (and bench/card_envs_grid.sh) with bench/stop_workers.sh: the runs checkpoint first.
# Tables and figures afterwards: bench/continual.py --setting S --plot-only [--out ...] (the commands in bench/README).
set -u
cd "$(dirname "$0")/.."
# the session's autogroup weight, as bench/card_envs_grid.sh sets it (the two workers share the cores alike)
[ -n "${GRID_PLAN:-}" ] || echo -5 2>/dev/null > /proc/self/autogroup || true
export OMP_NUM_THREADS=1
SEEDS="0 1 2 3 4"
# GRID_PLAN=1: print each call's arguments ("PLAN <args>") instead of running it (bench/queue_status.py reads them)
run() {
  if [ -n "${GRID_PLAN:-}" ]; then echo "PLAN $* --seeds $SEEDS --jobs 1"; return; fi
  echo "$(date -u +%FT%T) $*"; nice -n -5 python bench/continual.py "$@" --seeds $SEEDS --jobs 1 --no-diagnostics-plots || true
}
BANDIT="--setting bandit --out bench/results/continual/bandit_protocol"
CARTPOLE="--setting cartpole_obs"
# 1. issue #29's control: head reset at every switch (value head; both heads and the policy head are done)
run $CARTPOLE --methods ppo_value_head_reset
# Fourier's control (twenty-first session): Tanh, bounded hidden features like sin / cos, on PerturbedCartPole
# (~50 CPU-min, ahead of the rest: it tests the mechanism of the best row of the table)
run $CARTPOLE --methods ppo_tanh
#    and its other two controls, running observation normalisation and FIRE at every switch on the hidden layers
#    only, through bench/grid.py's distributed path (issue #29 part 6): one optuna study on PostgreSQL, this worker and
#    a second one started by hand with the same command; the grid's cells go to bench/results/continual/cartpole_obs
STORAGE=${SB3_PLASTIC_GRID_STORAGE:-postgresql+psycopg2://sb3plastic:sb3plastic@127.0.0.1:5432/sb3plastic}
echo "$(date -u +%FT%T) grid.py issue29-controls"
[ -n "${GRID_PLAN:-}" ] || nice -n -5 python bench/grid.py --storage "$STORAGE" --study issue29-controls --settings cartpole_obs \
    --methods ppo_vecnorm ppo_fire_switch_hidden --seeds 0 1 2 3 4 || true
# 2. issue #27: the isometry penalty's options in the authors' convention
for m in plastic_relu_rect plastic_relu_s2 plastic_maxmin_rect plastic_relu_s2_rect; do run $BANDIT --methods $m; done
for m in plastic_relu_rect plastic_relu_s2 plastic_maxmin_rect plastic_relu_s2_rect; do run $CARTPOLE --methods $m; done
# 2b. issue #29 part 2's anchor before the toy settings' remaining rows (a published number first): plain PPO's five
#    continual runs on C-CHAIN's CartPole (~40 CPU-min each; their fresh agents, the Oracle, come at step 4)
run --setting cchain_cartpole --methods ppo --fresh none
#    and its check: the plain agent on C-CHAIN's vanilla PPO targets (advantages normalised per rollout, lambda = 1
#    value targets; bench/cchain_vanilla.py): do the two differences SB3's PPO can be given move our level to theirs?
run --setting cchain_cartpole --methods ppo_cchain_vanilla --fresh none
# 3. issue #30: the field's methods, and head reset on the bandit
#    (the bandit's rows first: ~8 CPU-min a method, its table complete before the cartpole_obs rows)
#    (weight clipping, added in the twenty-third session, comes last: its rows before the head2 control's)
FIELD="ppo_head_reset ppo_policy_head_reset ppo_cchain ppo_trac ppo_parseval ppo_layernorm ppo_crelu ppo_fourier
       ppo_injection ppo_adam_equal_betas ppo_weight_clipping"
for m in $FIELD; do run $BANDIT --methods $m; done
for m in $FIELD; do run $CARTPOLE --methods $m; done
#    and the injection's control: the 2 layers an injection freezes and replaces, re-drawn at every switch instead
for setting in "$BANDIT" "$CARTPOLE"; do run $setting --methods ppo_head2_reset; done
# 4. issue #29 part 2: C-CHAIN's continual Gym control. First the anchor on all three envs: plain PPO's continual
#    runs on Acrobot and LunarLander (5 seeds, ~9 CPU-hours; CartPole's are done) beside their vanilla agent's
#    published number (twenty-second session: moved ahead of the Oracle, so that the agreement the issue asks about
#    is checked on every env before the card's grid takes this worker), then plain PPO with a fresh agent on every
#    task (their Oracle) on each env, CartPole first (~10 CPU-hours an env)
for env in cchain_acrobot cchain_lunar; do run --setting $env --methods ppo --fresh none; done
#    (twenty-sixth session) then the card grid's update-intensive MinAtar cells as its second worker, ahead of the
#    Oracle: its methods' seeds 1-4 are issue #28's "8 methods x 5 seeds" (~35 CPU-hours), and worker 1 holds
#    C-MinAtar's ~12 CPU-hour run meanwhile
#    (thirty-ninth session) the isometry penalty's two halves (`isometry_side`) on the two toy settings, where its ReLU
#    arm is above plain PPO (bandit 0.605 against 0.291; PerturbedCartPole 218 against 62, never collapsing): does the
#    floor (directions kept alive) or the cap (no growth above the target) carry that? On permuted SpaceInvaders the
#    cap is all of the penalty's cost in learning speed and the floor never acts (bench/README.md). ~0.5 CPU-hours on
#    the bandit, ~2.3 on PerturbedCartPole, ahead of the card grid's cells: they read the library's own method.
for m in plastic_relu_floor plastic_relu_ceiling; do run $BANDIT --methods $m; done
for m in plastic_relu_floor plastic_relu_ceiling; do run $CARTPOLE --methods $m; done
#    (fortieth session) the control of the card setting's head-reset row: re-drawing both output layers at every switch
#    holds plain PPO's fresh level on permuted SpaceInvaders (5 seeds: 23.4 against plain 20.7, ratio 1.03), so "the
#    loss sits in the heads"; which head? The action head alone, then the value head alone, 5 seeds each, plain PPO's
#    fresh agents (35-50 CPU-min a run, ~8 CPU-hours), as issue #29's controls split it on PerturbedCartPole (both 482,
#    action head 433, value head 152). Post hoc controls of a mechanism claim, not rows of the fixed grid.
#    (forty-first session) first the control of the conv-only MaxMin + AdamO arm, whose seed 0 ended tasks 10-19 at
#    42 against plain PPO's 19 on its sequence (its fresh agents 22, plain PPO's speed), the highest of any arm:
#    MaxMin and the library's orthogonal init with no penalty and Adam (`plastic_maxmin_off`), 5 seeds with its own
#    fresh agents (~1 CPU-hour a seed). Is it the activation and init, or the conv layer's penalty?
run --setting minatar_intensive --methods plastic_maxmin_off --fresh sample
run --setting minatar_intensive --methods ppo_policy_head_reset --fresh sample
#    (forty-third session) that control, the grid's strongest agent at 5 seeds (33.0 against plain PPO's 20.7), differs
#    from plain PPO in its activation (MaxMin) and its init (orthogonal, gain 1 on the hidden layers; SB3's gain
#    sqrt(2)): the other two cells of the 2 x 2, MaxMin with SB3's init and ReLU with the library's, both with Adam
#    and no penalty, 5 seeds with their own fresh agents (seeds 0-2 of both first; ~1 CPU-hour a seed)
for seeds in "0 1 2" "3 4"; do
  for m in plastic_maxmin_off_sb3init plastic_relu_off_ortho; do
    SEEDS=$seeds run --setting minatar_intensive --methods $m --fresh sample
  done
done
#    (forty-fifth session) what of MaxMin's activation carries it? MaxMin maps a pair (a, b) to ((a+b)/2 + |a-b|/2,
#    (a+b)/2 - |a-b|/2): every unit passes gradient (no dead units) and the layer keeps its input's norm. CReLU
#    (Abbas et al., 2023; `ppo_crelu`: (relu(z), relu(-z)), plain PPO's SB3 init and Adam) shares both properties and
#    differs in that each of its directions gives both the linear and the |.| part (MaxMin's pair gives them two
#    directions); with the library's convention it has half the units per layer (half the parameters). Seeds 0-2 with
#    their own fresh agents (~1 CPU-hour a seed): does the pair of properties carry the climb without MaxMin's pairing?
SEEDS="0 1 2" run --setting minatar_intensive --methods ppo_crelu --fresh sample
#    (forty-seventh session) CReLU's seed 0 climbed as MaxMin does (35.0 on tasks 10-19 against its fresh agents'
#    23.3). Which of the two properties carries it? LeakyReLU (`ppo_leaky_relu`, slope 0.01, plain PPO's widths, init
#    and Adam) keeps the first, no dead unit, without the second, the norm. Seeds 0-2 with their own fresh agents
#    (~1 CPU-hour a seed), then both controls' seeds 3-4 (5 seeds each, the protocol's count).
SEEDS="0 1 2" run --setting minatar_intensive --methods ppo_leaky_relu --fresh sample
for m in ppo_crelu ppo_leaky_relu; do SEEDS="3 4" run --setting minatar_intensive --methods $m --fresh sample; done
#    (forty-third session) where do the MaxMin curves settle? At 20 tasks the no-penalty MaxMin control (5 seeds) and
#    the conv-only arm (4) peak between tasks 7 and 16 and most fall back part of the way. Seed 0 over 40 tasks (its
#    first 20 are the 20-task folder's sequence: the permutations depend on the seed and the task index alone) for
#    plain PPO, that control and S&P at every switch (the strongest method named before the grid), no fresh agents
#    (the 20-task folder's are the level: the tasks are alike), ~4.5 CPU-hours. A hint from one seed each.
for m in ppo plastic_maxmin_off ppo_snp; do
  SEEDS=0 run --setting minatar_intensive --tasks 40 --methods $m --fresh none --out bench/results/continual/minatar_intensive_40tasks
done
run --setting minatar_intensive --methods ppo_value_head_reset --fresh sample
CARD_GRID_SETTING=minatar_intensive bash bench/card_envs_grid.sh 2 || true
for env in cchain_cartpole cchain_acrobot cchain_lunar; do run --setting $env --methods ppo --fresh all; done
# 5. the card's environments come first (issue #28): this worker joins bench/card_envs_grid.sh as its second worker
#    (the two share its list through the runs' claims) until that list is done
bash bench/card_envs_grid.sh 2 || true
# 6. the rest of the Gym-control grid: the methods on CartPole (the three whose papers report it first), then Acrobot
#    and LunarLander (~45-65 CPU-min a run, ~120 CPU-hours in all)
#    (weight clipping, a column of C-CHAIN's table, after the methods the issue names)
CCHAIN_METHODS="ppo_l2_init ppo_trac ppo_cchain ppo_fire_switch ppo_head_reset plastic_relu ppo_weight_clipping"
for m in $CCHAIN_METHODS; do run --setting cchain_cartpole --methods $m --fresh sample; done
for env in cchain_acrobot cchain_lunar; do
  for m in $CCHAIN_METHODS; do run --setting $env --methods $m --fresh sample; done
done
