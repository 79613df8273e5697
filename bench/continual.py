"""Continual-RL grid: methods x seeds on a non-stationary env, with fresh-agent references, rliable statistics,
per-run JSON results and plots that rebuild from them.

Every run trains one agent through a sequence of tasks (``--tasks``, each ``--change-every`` env steps of
every env copy) with :class:`~sb3_plastic.callbacks.PlasticityMonitor` logging the plasticity diagnostics,
and records per task the **reward per env step** and the **mean episode return** over the last ``tail`` part of the
task (20 % unless the setting says otherwise; the setting's ``score`` picks which one the tables use).

The protocol of issue #14 (DESIGN.md, "Continual semantics"):

* **Fresh-agent reference (warm-start test).** For every task ``k`` of a run's sequence a freshly initialised agent
  of the same method (same seed, network, optimizer and callbacks) trains on task ``k`` alone (the env pinned to
  task ``k`` with ``pin_task``) for the same budget, one task. Plasticity at task ``k`` = continual score on task
  ``k`` / fresh score on task ``k``; reported per task and over the last half of the run, next to the absolute
  scores. Interventions that act at task changes or at the continual run's midpoint (Shrink & Perturb, both FIRE
  methods) never trigger within one task, so their fresh agents run without them: they are the plain agent's fresh
  runs, copied from them where those exist (``reused_from`` in the JSON). ``--fresh none`` skips them.
* **Independent task sequences per seed**: run seed ``s`` trains on the task sequence of ``task_seed = s``.
* **Statistics** (:mod:`rl_stats`): per method the IQM (rliable's ``aggregate_iqm``) over runs x last-half tasks with
  a bootstrap 95 % CI over runs (each resampled run keeps all its tasks: the run is the independent unit), and the
  probability of improvement over the plain baseline (rliable's
  ``probability_of_improvement``) with its CI; "vs plain": Welch's t interval of the difference between the
  method's and the plain baseline's runs' last-half means (``rl_stats.welch_t_ci``), "not resolved" where it holds 0;
  "continual vs fresh": the paired ratio of means sum(continual) / sum(fresh) over the same cells, judged by its
  Student-t interval over runs (``rl_stats.ratio_of_means_t_ci``; the percentile bootstrap is too narrow at 3-5 runs,
  ``bench/verdict_coverage.py``). No verdict ("too few seeds") below 3 runs of the method (for "vs plain" also of
  the plain baseline: ``continual_report.MIN_PLAIN_VERDICT_SEEDS``).

Methods (``--methods``; default: all but ``ppo_fire_switch``, ``ppo_cbp_dohare``, ``ppo_redo`` and the baselines of
issue #15; on a DQN / SAC setting the ``ppo`` prefix reads ``dqn`` / ``sac``: ``dqn``, ``dqn_l2``, ...):

==================  =======================================================================================
``ppo``             the setting's SB3 algorithm, ReLU, Adam (the plain baseline; the library's CNN on MinAtar)
``ppo_l2``          L2 regularisation (Adam ``weight_decay``, coupled, ``--l2``)
``ppo_snp``         :class:`~sb3_plastic.callbacks.ShrinkPerturb` at every task change (Ash & Adams)
``ppo_cbp``         :class:`~sb3_plastic.callbacks.ContinualBackprop` (Dohare et al., 2024) at this library's defaults
``ppo_cbp_dohare``  Continual Backprop at Dohare's RL settings (his Slippery Ant runs): Adam betas (0.99, 0.99),
                    L2 1e-4 (Adam ``weight_decay``), maturity 10 000, replacement rate 1e-4
``ppo_redo``        :class:`~sb3_plastic.callbacks.ReDo` (Sokar et al., 2023) at the library defaults
``ppo_fire``        :class:`~sb3_plastic.callbacks.FIRE` once at the midpoint of the run (the FIRE paper)
``ppo_fire_switch`` FIRE at every task change
``plastic_relu``    the plastic algorithm (:class:`~sb3_plastic.PlasticPPO` / DQN / SAC), ReLU, AdamO + isometry penalty
``plastic_maxmin``  the plastic algorithm, MaxMin (GroupSort-2) with orthogonal init, AdamO + isometry penalty
``ppo_l2_init``     :class:`~sb3_plastic.callbacks.L2Init` (Kumar et al., 2023; ``--l2-init-coef``)
``ppo_spectral``    :class:`~sb3_plastic.callbacks.SpectralRegularisation` (Lewandowski et al., 2024;
                    ``--spectral-coef``)
``ppo_adam_equal_betas`` the setting's SB3 algorithm with Adam beta1 = beta2 = 0.99 (Dohare et al., 2023's fix of
                    PPO's policy collapse), nothing else changed
``ppo_nap``         the plastic algorithm with ``nap=True`` (Normalize-and-Project, Lyle et al., 2024), ReLU,
                    isometry penalty off, Adam: the plain agent with layer norms and the projection
``plastic_*_rect``  ``plastic_relu`` / ``plastic_maxmin`` with ``isometry_rect_scale=True`` (issue #27)
``plastic_relu_s2`` ``plastic_relu`` with ``isometry_scale=2`` (``plastic_relu_s2_rect``: and rect_scale)
``plastic_relu_free`` ``plastic_relu`` with ``isometry_free_scale=True``: the penalty holds the weights' shape, not
                    their scale; ``plastic_relu_conv`` / ``plastic_relu_linear``: the penalty on the CNN's conv /
                    linear layer alone (the PlasticCNN's names); ``plastic_maxmin_conv``: MaxMin + AdamO, the conv
                    layer alone; ``plastic_relu_floor`` / ``plastic_relu_ceiling`` (``_linear_floor`` /
                    ``_linear_ceiling``: on the linear layer alone): ``isometry_side``, only the squared singular
                    values below / above the target penalised; ``plastic_relu_ceiling_s16`` / ``_s64``: the
                    ceiling at ``isometry_scale`` 16 / 64 (singular values capped at 4 / 8)
``ppo_head_reset``  :class:`~sb3_plastic.callbacks.LayerReset` of both output heads at every task change (Nikishin
                    et al., 2022; issue #29's control); ``ppo_policy_head_reset`` / ``ppo_value_head_reset`` one head
                    (DQN: the Q head)
``ppo_injection``   :class:`~sb3_plastic.callbacks.PlasticityInjection` of a 2-layer head at every task change
``ppo_head2_reset`` LayerReset of the last 2 layers of every path at every task change: the layers ``ppo_injection``
                    freezes and replaces, re-drawn instead (the injection's control)
``ppo_cchain``      :class:`~sb3_plastic.callbacks.ChurnReduction` (C-CHAIN, Tang et al., 2025) at the reference settings
``ppo_trac``        the plain agent's network, TRAC around Adam (``optimizer="trac"``, Muppidi et al., 2024)
``ppo_parseval``    :class:`~sb3_plastic.callbacks.ParsevalRegularisation` (Chung et al., 2024; ``--parseval-coef``)
``ppo_weight_clipping`` :class:`~sb3_plastic.callbacks.WeightClipping` (Elsayed et al., 2024; ``--weight-clipping-kappa``)
``ppo_crelu``       the plain agent with CReLU (Abbas et al., 2023; half the units per layer, the same feature widths)
``ppo_fourier``     the plain agent with deep Fourier features (Lewandowski et al., 2024; as ``ppo_crelu``)
``ppo_layernorm``   the plain agent with a layer norm before every ReLU, no projection (NaP without its projection)
``ppo_vecnorm``     the plain agent on SB3's running observation normalisation (``VecNormalize``, observations only;
                    issue #29's control, :func:`normalise_observations`)
``ppo_fire_switch_hidden`` FIRE at every task change on the hidden layers only, the output heads untouched (issue #29)
``ppo_leaky_relu``  the plain agent with LeakyReLU (slope 0.01) in every hidden layer, the CNN's included: no dead
                    unit without keeping the norm (the control of ``ppo_crelu``, forty-seventh session)
``ppo_l2_dohare``   Dohare et al.'s L2 agent of Slippery Ant: Adam betas (0.99, 0.99), L2 1e-3 (Adam ``weight_decay``)
``ppo_snp_continual`` continual Shrink & Perturb (``ShrinkPerturb("continual")``, library defaults) with Adam betas
                    (0.99, 0.99), as Dohare et al.'s regularised agents
``ppo_cbp_dohare_no_replace`` ``ppo_cbp_dohare``'s optimizer (Adam betas (0.99, 0.99), weight decay 1e-4) without
                    its unit replacement: the control that separates CBP's replacement from its L2 (thirty-first session)
``ppo_cchain_vanilla`` the plain agent on C-CHAIN's vanilla PPO targets (advantages normalised per rollout, lambda = 1
                    value targets; bench/cchain_vanilla.py): the Gym-control anchor's check (issue #29)
==================  =======================================================================================

The isometry paper's baselines (issue #15) are not in the default list: add them with ``--methods`` (e.g.
``--methods ppo ppo_l2_init ppo_spectral ppo_nap plastic_relu plastic_maxmin``); ``--methods all`` runs every
method of the setting's algorithm (the grid of issue #14).

Settings (``--setting``): see :data:`SETTINGS` (each entry's ``description``) and bench/README.md.

Layout of ``--out`` (default ``bench/results/continual/<setting>``)::

    runs/<method>/seed<k>.json              one finished continual run: per-task scores, diagnostics, timings
    runs/<method>/fresh/seed<k>_task<j>.json  the fresh agent of that run's task j
    tb/<method>/s<k>_1/, tb/<method>/fresh/  TensorBoard events (SB3's logger + PlasticityMonitor; not committed)
    summary.json, summary.md                the tables (IQM, CIs, probability of improvement, verdicts) of every
                                            method found there, whatever ``--methods`` this call ran
    end_of_task.png, plasticity.png, diagnostics.png   the figures, built from the JSON files alone

Resuming: a run whose JSON exists is skipped, so rerunning the same command after an interruption
finishes the grid (an unfinished run resumes from its checkpoint, ``bench/run_checkpoint.py``, or starts again from
scratch with its partial TensorBoard folder removed). A run is trained by one process at a time: it is claimed first
(``<json>.claim``, :func:`claim_run`), and a second process reaching a run that a live one is training reports it as
skipped by name (two processes on one run would share, and the later one delete, its TensorBoard folder). A call in
which no run finished leaves an existing summary and its figures as they are. ``--plot-only`` rebuilds
every table and figure from the JSON files (a fresh clone has them) and refuses to write anything when it finds no
runs; runs recorded before a diagnostic existed get it from their TensorBoard events where those are on disk
(:func:`add_hidden_dfi`, :func:`add_train_scalars`). To spread a grid over machines: ``bench/grid.py``.

Examples::

    python bench/continual.py --quick                                    # smoke test, ~1-2 min
    python bench/continual.py --seeds 0 1 2 --jobs 2                     # the CPU grid of bench/README.md
    python bench/continual.py --setting minatar_intensive --methods all --seeds 0 1 2 3 4 --jobs 14
    python bench/continual.py --setting minatar_intensive --device cuda --jobs 4   # on a GPU machine
    python bench/continual.py --setting minatar_intensive --plot-only    # rebuild tables and figures
    python bench/continual.py --setting cchain_cartpole --methods ppo --seeds 0 1 2 3 4 --fresh all  # C-CHAIN's Table 1
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing
import os
import re
import sys
import time
from dataclasses import asdict, replace  # noqa: F401  (continual.asdict, for the tests)
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The modules a test or a script reaches through this one (their call-time settings: continual_runs.CHECKPOINT_SECONDS,
# continual_recorder.HEAD_PROBE_STEPS, continual_report.REPS are read there, so that is where to patch them)
import continual_figures  # noqa: F401
import continual_recorder  # noqa: F401
import continual_report  # noqa: F401
import continual_runs  # noqa: F401
import run_checkpoint

# What the CLI uses, and every name other files use as ``continual.<name>`` (bench/grid.py, seed_table.py,
# setting_cost.py, denormals.py, the tests), or a pickle may name as ``__main__.<name>`` / ``continual.<name>`` (a
# checkpoint's policy_kwargs hold LeakyReLU01, its pickled env the reward wrapper's scaled_reward)
from continual_methods import (  # noqa: F401
    ALL_METHOD_NAMES,
    DEFAULT_METHODS,
    DOHARE_METHODS,
    METHODS,
    PPO_ONLY_METHODS,
    TASK_CHANGE_METHODS,
    MethodParams,
    build_model,
    canonical_method,
    lecun_init_,
    make_env,
    method_name,
    methods_of,
    normalise_observations,
    scaled_reward,
)
from continual_recorder import (  # noqa: F401
    _append_per_task,
    _rollout_reset,
    _task_recorder,
    add_hidden_dfi,
    add_train_scalars,
    head_statistics,
)
from continual_report import (  # noqa: F401
    NoRunsError,
    SettingMismatchError,
    _score,
    evaluation_summary,
    load_records,
    markdown_table,
    one_per_logged_step,
    report,
    rounded,
    summarise,
)
from continual_runs import (  # noqa: F401
    FRESH_CHOICES,
    FRESH_SAMPLE,
    RunClaimedError,
    _run_job,
    checkpoint_root,
    claim_run,
    fresh_sample,
    process_identity,
    run_cell,
    run_one,
    run_parts,
    run_path,
)
from continual_settings import (  # noqa: F401
    ALGOS,
    LATE_FIELDS,
    SCORE_LABELS,
    SETTINGS,
    LeakyReLU01,
    Setting,
    same_setting,
    setting_config,
)


def parse_ppo_kwargs(items: list[str], algo: str = "ppo") -> dict[str, Any]:
    """``["ent_coef=0.01", ...]`` -> ``{"ent_coef": 0.01}``; a key the algorithm does not take is a ``ValueError``."""
    import inspect

    import stable_baselines3
    import yaml

    ignored = {"self", "policy", "env", "policy_kwargs", "seed", "device"}
    cls = getattr(stable_baselines3, ALGOS[algo][0])
    allowed = {k for k in inspect.signature(cls.__init__).parameters if k not in ignored and not k.startswith("_")}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ValueError(
                f"--ppo-kwarg expects KEY=VALUE with KEY a {cls.__name__} keyword ({', '.join(sorted(allowed))}), "
                f"got {item!r}"
            )
        out[key] = yaml.safe_load(value)
    return out


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="bandit")
    p.add_argument("--methods", nargs="+", choices=[*ALL_METHOD_NAMES, "all"],
                   help="methods (default: the default list; with --plot-only: every method found; 'all': all)")
    p.add_argument("--seeds", nargs="+", type=int,
                   help="run seeds (default 0 1 2; --quick: 0); --plot-only summarises every seed it finds")
    p.add_argument("--tasks", type=int, help="number of tasks (default: the setting's)")
    p.add_argument("--change-every", type=int, help="task length in env steps per env copy (default: the setting's)")
    p.add_argument("--fresh", choices=FRESH_CHOICES, default="all",
                   help=f"fresh-agent references: one per task of every run (all), {FRESH_SAMPLE} tasks of each run's "
                        "last half (sample: for tasks alike in distribution) or none")
    p.add_argument("--fresh-only", action="store_true",
                   help="train only the fresh agents of each cell, not its continual run (fresh agents are short and "
                        "independent: spread them over cores the continual runs do not use); the folder's tables "
                        "are left as they are")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes; a GPU is shared by them)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--device", default="cpu", help="torch device of the agents: cpu, cuda, cuda:1, auto")
    p.add_argument("--out", help="output folder (default bench/results/continual/<setting>[_quick])")
    p.add_argument("--quick", action="store_true", help="2 short tasks, one seed: a smoke test (~1 min)")
    p.add_argument(
        "--ppo-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a keyword of the setting's algorithm for every method, e.g. ent_coef=0.01 (repeatable; "
        "VALUE read as yaml)",
    )
    p.add_argument("--plot-only", action="store_true", help="only rebuild the tables and figures from the run JSONs")
    p.add_argument("--no-diagnostics-plots", action="store_true", help="skip the diagnostics figure")
    p.add_argument("--tb-plots", action="store_true", help="also plot the TensorBoard events (plots/)")
    for f in MethodParams.__dataclass_fields__.values():
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    try:
        args.ppo_overrides = parse_ppo_kwargs(args.ppo_kwarg, SETTINGS[args.setting].algo)
    except ValueError as exc:
        p.error(str(exc))
    for name in ("tasks", "change_every", "jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.fresh_only and (args.fresh == "none" or args.plot_only):
        p.error(f"--fresh-only trains the fresh agents of --fresh all or sample; got --fresh {args.fresh}"
                + (" with --plot-only, which trains nothing" if args.plot_only else ""))
    algo = SETTINGS[args.setting].algo
    if args.methods is not None:
        if "all" in args.methods:
            args.methods = methods_of(algo)
        wrong = [m for m in args.methods if m not in methods_of(algo)]
        if wrong:
            p.error(f"--methods {' '.join(wrong)}: not a method of the {algo} setting {args.setting!r}; allowed: "
                    + ", ".join(methods_of(algo)))
    return args


def resolve_setting(name: str, quick: bool = False, tasks: Optional[int] = None, change_every: Optional[int] = None,
                    overrides: Optional[dict[str, Any]] = None) -> Setting:
    """The setting ``name`` with the command line's changes (``--quick``, ``--tasks``, ``--change-every``,
    ``--ppo-kwarg``); bench/grid.py builds its cells with the same function."""
    setting = SETTINGS[name]
    if quick:
        setting = replace(
            setting, tasks=2, change_every=max(setting.change_every // 16, 64), monitor_every=setting.change_every
        )
    if tasks is not None:
        setting = replace(setting, tasks=tasks)
    if change_every is not None:
        setting = replace(setting, change_every=change_every)
    if setting.task_timesteps != SETTINGS[name].task_timesteps:  # the description says the new interval
        steps = setting.task_timesteps
        text = f"{steps / 1e6:g}M" if steps % 1_000_000 == 0 else f"{steps / 1000:g}k"
        description = re.sub(r"every [\d.]+[kM] steps", f"every {text} steps", setting.description)
        setting = replace(setting, description=re.sub(r"[\d.]+M steps each", f"{text} steps each", description))
    if overrides:
        setting = replace(setting, ppo={**setting.ppo, **overrides})
    return setting


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    setting = resolve_setting(args.setting, args.quick, args.tasks, args.change_every, args.ppo_overrides)
    if args.plot_only and args.seeds is not None:
        print(f"warning: --seeds {' '.join(map(str, args.seeds))} has no effect with --plot-only: every run found is "
              "summarised", file=sys.stderr, flush=True)
    if args.plot_only and args.methods is not None:
        print(f"warning: --methods {' '.join(args.methods)} has no effect with --plot-only: every method found is "
              "summarised", file=sys.stderr, flush=True)
    if args.seeds is None:
        args.seeds = [0] if args.quick else [0, 1, 2]
    params = MethodParams(**{f: getattr(args, f) for f in MethodParams.__dataclass_fields__})
    out = args.out or os.path.join("bench", "results", "continual", args.setting + ("_quick" if args.quick else ""))
    methods = args.methods
    if methods is None and not args.plot_only:
        methods = [method_name(m, setting.algo) for m in DEFAULT_METHODS]
    if args.plot_only:  # what the tables will summarise: every continual run found
        methods = None
        found = sorted({r["seed"] for r in load_records(out) if r.get("fresh_task") is None})
        seeds = " ".join(map(str, found)) + " (every seed found)" if found else "none found"
    else:
        seeds = " ".join(map(str, args.seeds))
    print(
        f"setting={args.setting}: {setting.description}; {setting.tasks} tasks x {setting.task_timesteps} env steps "
        f"({setting.change_every} per copy x {setting.n_envs} copies), methods={' '.join(methods or ['(found)'])}, "
        f"seeds={seeds}, fresh={args.fresh}, device={args.device}, jobs={args.jobs}, out={out}",
        flush=True,
    )
    if not args.plot_only:
        run_checkpoint.install_stop_handler()  # SIGUSR1: checkpoint the runs in progress and stop (stop_workers.sh)
        os.makedirs(out, exist_ok=True)
        cells = [(m, s, k) for s in args.seeds for m in methods for k in run_parts(setting, args.fresh, s)
                 if k is not None or not args.fresh_only]
        jobs = [(m, s, k, setting, params, out, args.device, args.threads) for m, s, k in cells
                if not os.path.exists(run_path(out, m, s, k))]
        skipped = len(cells) - len(jobs)
        if skipped:
            print(f"resuming: {skipped} finished runs skipped", flush=True)
        failures, claimed, stopped, finished = [], [], [], 0
        start = time.time()
        if args.jobs == 1:
            outcomes = map(_run_job, jobs)
        else:
            pool = futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
            outcomes = (f.result() for f in futures.as_completed([pool.submit(_run_job, j) for j in jobs]))
        for method, seed, fresh_task, seconds, error in outcomes:
            # a run another live worker holds is not a failure: that worker writes it
            held = bool(error) and error.startswith(f"{RunClaimedError.__name__}:")
            halted = bool(error) and error.startswith(f"{run_checkpoint.RunStopped.__name__}:")
            status = (f"skipped, another worker holds it ({error})" if held else f"stopped ({error})" if halted
                      else "FAILED " + error if error else "done")
            what = "" if fresh_task is None else f" fresh task {fresh_task}"
            print(f"[{time.time() - start:7.0f}s] {method} seed {seed}{what}: {status} ({seconds / 60:.1f} min)",
                  file=sys.stderr, flush=True)
            if held:
                claimed.append((method, seed, fresh_task))
            elif halted:
                stopped.append((method, seed, fresh_task))
            elif error:
                failures.append((method, seed, fresh_task, error))
            else:
                finished += 1
        if args.jobs != 1:
            pool.shutdown()
        if claimed:
            print(f"{len(claimed)} runs skipped: another worker holds them ({claimed}); the same command, run again "
                  "once that worker is done, finds them finished or resumes what it left", flush=True)
        if failures:
            print(f"{len(failures)} runs failed: {failures}", flush=True)
        if stopped:
            # asked to stop (the end of a session): the tables wait for the next call, or --plot-only
            print(f"stopped on request: {len(stopped)} runs not finished ({stopped}); the same command resumes them "
                  "from their checkpoints (the folder's tables and figures are left as they are)", flush=True)
            return 3
        if args.fresh_only:
            print("--fresh-only: the folder's tables and figures are left as they are (they summarise continual runs; "
                  "rebuild them with --plot-only)", flush=True)
            return 0
        if not finished and os.path.exists(os.path.join(out, "summary.json")):
            # a grid worker's call on cells that are done or held: rebuilding a folder of many methods costs minutes
            print("no run finished in this call: the folder's tables and figures are left as they are (rebuild them "
                  "with --plot-only)", flush=True)
            return 0
    try:  # the folder's tables and figures summarise every method found there, not only the ones this call ran
        report(out, args.setting, setting, None, diagnostics=not args.no_diagnostics_plots, tb_plots=args.tb_plots)
    except (NoRunsError, SettingMismatchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
