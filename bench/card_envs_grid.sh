#!/usr/bin/env bash
# The grid of issue #28 (the card's environments under the protocol) in the order its cells run: the most informative
# first. Start one worker per free core (each run on one torch thread; more runs than cores cost ~25 % of the
# machine: bench/README.md). On the 2-core machine beside bench/protocol_grid.sh, one worker:
#     nohup setsid bench/card_envs_grid.sh 1 > /tmp/grid1.log 2>&1 &
# and where the grid has the cores to itself, a second one:
#     nohup setsid bench/card_envs_grid.sh 2 > /tmp/grid2.log 2>&1 &
# Every worker walks the same list; bench/continual.py skips a finished run, reports a run another live worker holds as
# skipped (its claim) and resumes a run from its checkpoint (bench/run_checkpoint.py), so two workers share the list
# and a new session continues where the last one stopped. At a session's end, stop the workers with
# `bench/stop_workers.sh` (each run checkpoints at its next rollout start, then stops: nothing since its last
# periodic checkpoint is lost, and no further run starts), then commit what finished and the
# checkpoints of the runs in progress:
#     git add bench/results/continual/*/runs && git add -f bench/results/continual/*/ckpt
# The runs go at nice -5, and their session's autogroup at -5 too: this grid comes before other work on the machine
# (bench/README.md, issue #28).
set -u
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
# With the kernel's autogroup scheduling on (the default of most Linux desktops and VMs: /proc/sys/kernel/
# sched_autogroup_enabled), a process's nice value only ranks it within its session; sessions share the CPU alike, so
# `nice -n -5` alone gave each grid run the same share as a test run in another terminal. The session's own weight is
# /proc/self/autogroup (writable by its owner for raising, by root for lowering): set it where allowed.
# It is the weight of the whole session: start the workers with `setsid` (as below) so that it stays theirs.
[ -n "${GRID_PLAN:-}" ] || echo -5 2>/dev/null > /proc/self/autogroup || true
# GRID_PLAN=1: print each call's arguments ("PLAN <args>") instead of running it (bench/queue_status.py reads them)
# CARD_GRID_SETTING=S: walk only the calls on setting S (bench/protocol_grid.sh's worker takes minatar_intensive's
# methods this way while worker 1 holds C-MinAtar's long run)
run() {
  if [ -n "${CARD_GRID_SETTING:-}" ] && [[ " ${*:2} " != *" --setting $CARD_GRID_SETTING "* ]]; then return; fi
  if [ -n "${GRID_PLAN:-}" ]; then echo "PLAN ${*:2}"; return; fi
  echo "$(date -u +%FT%T) worker ${1:-?} $*"; nice -n -5 python bench/continual.py "${@:2}" --no-diagnostics-plots || true
}
w=${1:-1}
MI="--setting minatar_intensive"
# 1. plain PPO, 5 seeds: continual runs, then the fresh sample, then seed 0's fresh agents on every task (the check)
for s in 0 1 2 3 4; do run "$w" $MI --methods ppo --seeds $s --fresh none; done
for s in 0 1 2 3 4; do run "$w" $MI --methods ppo --seeds $s --fresh sample; done
run "$w" $MI --methods ppo --seeds 0 --fresh all
# 2. plain PPO on Slippery Ant, one seed at each friction interval tried (bench/README reports every interval):
#    200k env steps per task (the setting's default, 10 tasks, 2 M steps) and 500k (10 tasks, 5 M steps)
SA="--setting slippery_ant_ppo"
run "$w" $SA --methods ppo --seeds 0 --fresh sample
run "$w" $SA --methods ppo --seeds 0 --fresh sample --change-every 125000 --out bench/results/continual/slippery_ant_ppo_500k
# 3. the methods, one seed of each first (C-MinAtar's seed 0 next), then the rest. ReLU + AdamO and MaxMin + AdamO
#    run in the authors' convention (issue #27: lambda 0.2 = MethodParams' default, the old convention's 0.1; its two options, rect_scale
#    and s = 2, did not help on the bandit, so the defaults stay; the MinAtar CNN has no tall layer, so rect_scale
#    changes nothing here); head reset at every switch is LayerReset (issue #30). The library's own method comes
#    right after the two switch-time resets, so that the comparison the card is about is read first.
METHODS="ppo_snp ppo_fire_switch plastic_relu plastic_maxmin ppo_adam_equal_betas ppo_cbp_dohare ppo_l2_init
         ppo_head_reset ppo_nap ppo_spectral"
for m in $METHODS; do run "$w" $MI --methods "$m" --seeds 0 --fresh sample; done
#    and ReLU + AdamO at the library's default coefficient (0.02, a tenth of the grid's 0.2), seed 0: is the library's
#    own method handicapped by the grid's choice? (on PerturbedCartPole the smaller coefficient learnt faster)
run "$w" $MI --methods plastic_relu --seeds 0 --fresh sample --isometry-coef 0.02 \
    --out bench/results/continual/minatar_intensive_iso0.02
#    and L2-init at a tenth of the grid's coefficient (1e-4), seed 0: its fresh agents at 1e-3 learn as slowly as
#    ReLU + AdamO's (10.6-13.1 against plain PPO's 20-31); is the pull or its strength what costs the speed?
run "$w" $MI --methods ppo_l2_init --seeds 0 --fresh sample --l2-init-coef 1e-4 \
    --out bench/results/continual/minatar_intensive_l2init1e-4
#    and deep Fourier features (issue #30; not among the grid's methods, seed 0 first): on both toy settings the best
#    method not told of the switch (PerturbedCartPole 500 [481, 500], at its fresh agents); does it carry over to the
#    CNN? (the library's width convention: half the units per layer, the activation doubles the features)
run "$w" $MI --methods ppo_fourier --seeds 0 --fresh sample
# 4. Slippery Ant at Dohare et al.'s own design (slippery_ant_dohare: a new friction every 2 M steps, 20 M steps, their
#    minibatch of 128; ~6-7.5 CPU-hours a run, checkpointed), plain PPO seed 0 first: does plain PPO's decline show at
#    all before the methods are run on it (bench/README: the 200 k and 500 k intervals showed none)
SD="--setting slippery_ant_dohare"
#    (twenty-ninth session: his networks had 111 inputs, 84 of them always-zero contact forces, so his LeCun bound on
#    the first layer was sqrt(3/111); the setting now pads the observation to 111 and both runs below started again.
#    First the task-0 ablation of his terminal time limit, 23 CPU-min, then plain PPO's full run)
run "$w" --setting slippery_ant_dohare_bootstrap --methods ppo --seeds 0 --fresh none --tasks 1
run "$w" $SD --methods ppo --seeds 0 --fresh none
# 5. C-MinAtar's plain Double DQN at C-CHAIN's protocol, seed 0 (~10 CPU-hours, checkpointed: it spans sessions; with
#    one worker on the grid it comes after the methods' first seed, so that the card's question is read first)
run "$w" --setting cminatar --methods dqn --seeds 0 --fresh sample
#    then seeds 1-4 of every method; and of L2-init at 1e-4 too, as an arm of its own beside the grid's 1e-3 row
#    (twenty-first session): its coefficient was chosen after seed 0 (22.5 against 1e-3's 15.0), so only seeds 1-4
#    test it without that choice; the grid's row stays at the coefficient fixed before the grid (bench/README.md)
L2I4="--l2-init-coef 1e-4 --out bench/results/continual/minatar_intensive_l2init1e-4"
for s in 1 2 3; do
  for m in $METHODS; do run "$w" $MI --methods "$m" --seeds $s --fresh sample; done
  run "$w" $MI --methods ppo_l2_init --seeds $s --fresh sample $L2I4
done
#    seed 4 (thirty-ninth session): NaP's, spectral regularisation's and L2-init at 1e-4's wait behind the conv-only
#    arms below. With head reset's seed 4 the grid has its 8 methods x 5 seeds (issue #28), and the conv-only arms ask
#    the section's open question: does the library's penalty keep plasticity where it costs no learning speed (the
#    single-task runs: the penalty's cost is its cap on the linear layer's singular values)?
SEED4_LATER="ppo_nap ppo_spectral"
for m in $METHODS; do
  [[ " $SEED4_LATER " == *" $m "* ]] || run "$w" $MI --methods "$m" --seeds 4 --fresh sample
done
#    and ReLU + AdamO with the penalty on the CNN's conv layer alone (thirty-seventh session; an arm chosen after the
#    single-task runs of seeds 0-2's first tasks, bench/README.md: the linear layer's penalty is what slows its fresh
#    agents, the conv layer's costs nothing there): does the penalty where it costs no speed keep plasticity over 20
#    tasks? Seeds 0-2 with its own fresh agents; and MaxMin + AdamO's (the same single-task result: 23.5 against 14.0)
for s in 0 1 2; do run "$w" $MI --methods plastic_relu_conv --seeds $s --fresh sample; done
for s in 0 1 2; do run "$w" $MI --methods plastic_maxmin_conv --seeds $s --fresh sample; done
#    and the ReLU arm's seeds 3 and 4 (forty-first session: at 3 seeds its fresh agents learn at plain PPO's speed,
#    22.2 against 23.4, and its continual runs sit above plain PPO's on all three paired sequences, 22.5 against 20.7,
#    which Welch's test over 3 seeds cannot resolve: ~2 CPU-hours for the arm's 5)
for s in 3 4; do run "$w" $MI --methods plastic_relu_conv --seeds $s --fresh sample; done
#    and the MaxMin arm's seeds 3 and 4 (forty-first session: its seed 0 ended tasks 10-19 at 42 against plain PPO's 19,
#    the highest of any arm; its control without the penalty, `plastic_maxmin_off`, runs on bench/protocol_grid.sh)
for s in 3 4; do run "$w" $MI --methods plastic_maxmin_conv --seeds $s --fresh sample; done
#    then the seed-4 runs held back above
for m in $SEED4_LATER; do run "$w" $MI --methods "$m" --seeds 4 --fresh sample; done
run "$w" $MI --methods ppo_l2_init --seeds 4 --fresh sample $L2I4
#    and the control of the CBP arm (thirty-first session's audit): its optimizer exactly (Adam betas 0.99 / 0.99,
#    weight decay 1e-4) with no unit replacement, 5 seeds with its own fresh agents: is it CBP's replacement or the
#    L2 its arm carries that keeps the betas' run from collapsing?
for s in 0 1 2 3 4; do run "$w" $MI --methods ppo_cbp_dohare_no_replace --seeds $s --fresh sample; done
# 6. Slippery Ant, Dohare's arms (his ns.yml = Adam beta1 = beta2 = 0.99, cbp.yml, l2.yml, continual S&P with his
#    betas) and ReLU + AdamO, seed 0 of each (seeds 1-4 of every arm, plain included, in 8.)
DOHARE_ARMS="ppo_cbp_dohare plastic_relu ppo_l2_dohare ppo_snp_continual ppo_adam_equal_betas"
for m in $DOHARE_ARMS; do run "$w" $SD --methods "$m" --seeds 0 --fresh none; done
#    and the control of the CBP arm there (forty-eighth session: CBP's seed 0 ended the last five frictions at an IQM
#    of ~4900 against plain PPO's ~1330; on permuted SpaceInvaders its optimizer without the replacement did better
#    than CBP itself): CBP's optimizer exactly (betas 0.99 / 0.99, weight decay 1e-4), no unit replacement, seed 0
run "$w" $SD --methods ppo_cbp_dohare_no_replace --seeds 0 --fresh none
#    and the control of their terminal time limit (twenty-eighth session: on the first friction it halves plain PPO's
#    return, 1636 against 3927 with SB3's bootstrap): plain PPO seed 0 over all 10 frictions with the cut
#    bootstrapped. Does a decline under their design survive SB3's bootstrap?
run "$w" --setting slippery_ant_dohare_bootstrap --methods ppo --seeds 0 --fresh none \
    --out bench/results/continual/slippery_ant_dohare_bootstrap_20m
# 7. C-MinAtar at C-CHAIN's protocol (thirty-fifth session: moved before Slippery Ant's seeds 1-4, whose plan ends the
#    list): plain Double DQN seeds 1 and 2 (the issue asks for 3 seeds beside their vanilla 22.0 +- 0.7), then C-CHAIN
#    itself, seed 0, the continual run only (their Table 4 compares continual runs: 29.5 +- 0.7; ~15 CPU-hours, 1.6x
#    plain's per-update cost on a 30 k-step piece, bench/README.md): does the library's ChurnReduction on DQN reproduce
#    their gain where their own protocol and number are?
for s in 1 2; do run "$w" --setting cminatar --methods dqn --seeds $s --fresh sample; done
run "$w" --setting cminatar --methods dqn_cchain --seeds 0 --fresh none
# 8. Slippery Ant, seeds 1-4 of every arm, plain included, arm by arm (forty-first session: seed by seed over the six
#    arms reached the issue's "3 methods x 5 seeds" 6-9 runs, ~25-40 CPU-hours, later): plain PPO, CBP at Dohare's
#    settings (his method, the one his paper finds keeps Ant learning), ReLU + AdamO (this library's), L2 (his other
#    method that does), then continual S&P and Adam beta1 = beta2
for m in ppo $DOHARE_ARMS; do
  for s in 1 2 3 4; do run "$w" $SD --methods "$m" --seeds $s --fresh none; done
done
# 9. C-MinAtar's methods at the issue's fallback, a cheaper replay ratio (thirty-eighth session; the thirty-fourth's
#    measure: one gradient step every 4 env steps costs 0.31x their one per step). The target network is copied every
#    1 000 updates as theirs (4 000 env steps at this ratio); everything else is their protocol. Plain Double DQN at
#    this ratio is the methods' baseline (not their vanilla number), with fresh agents on games 2 and 3 for every arm.
#    Seeds 0-2 of plain, C-CHAIN, ReDo, L2-init and ReLU + AdamO, the seed-0 row of every arm first (~5 CPU-hours a
#    run with its two fresh agents, C-CHAIN's 1.6x; ~85 in all): which method keeps a DQN agent learning across the
#    three games?
CMR="--setting cminatar --ppo-kwarg train_freq=4 --ppo-kwarg target_update_interval=4000 --out bench/results/continual/cminatar_rr4"
for s in 0 1 2; do
  for m in dqn dqn_cchain dqn_redo dqn_l2_init plastic_relu; do run "$w" $CMR --methods "$m" --seeds $s --fresh sample; done
done
