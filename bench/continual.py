"""Continual-RL grid: methods x seeds on a non-stationary env, TensorBoard runs, per-task results and plots.

Every run trains one agent through a sequence of tasks (``--tasks``, each ``--change-every`` env steps of
every env copy) with :class:`~sb3_plastic.callbacks.PlasticityMonitor` logging the plasticity diagnostics,
and records the **reward per env step over the last 20 % of every task** ("end-of-task reward"; on the
random-label bandit that is the accuracy reached on that task). Every task of a setting is statistically
the same as the first, so task 0 is the fresh-agent reference of a warm-start test: a method that keeps
its plasticity reaches on task ``k`` what it reached on task 0.

Methods (``--methods``; default: all but ``ppo_fire_switch``):

==================  =======================================================================================
``ppo``             SB3's PPO, ReLU MLP, Adam (the plain baseline)
``ppo_l2``          PPO with L2 regularisation (Adam ``weight_decay``, coupled, ``--l2``)
``ppo_snp``         PPO + :class:`~sb3_plastic.callbacks.ShrinkPerturb` at every task change (Ash & Adams)
``ppo_cbp``         PPO + :class:`~sb3_plastic.callbacks.ContinualBackprop` (Dohare et al., 2024)
``ppo_fire``        PPO + :class:`~sb3_plastic.callbacks.FIRE` once at the midpoint of the run
``ppo_fire_switch`` PPO + FIRE at every task change
``plastic_relu``    :class:`~sb3_plastic.PlasticPPO`, ReLU, AdamO + isometry penalty
``plastic_maxmin``  PlasticPPO, MaxMin (GroupSort-2) with orthogonal init, AdamO + isometry penalty
``ppo_l2_init``     PPO + :class:`~sb3_plastic.callbacks.L2Init` (Kumar et al., 2023; ``--l2-init-coef``)
``ppo_spectral``    PPO + :class:`~sb3_plastic.callbacks.SpectralRegularisation` (Lewandowski et al., 2024;
                    ``--spectral-coef``)
``ppo_nap``         PlasticPPO ``nap=True`` (Normalize-and-Project, Lyle et al., 2024), ReLU, isometry penalty
                    off, Adam: PPO with layer norms and the projection
==================  =======================================================================================

The last three are the isometry paper's baselines (issue #15), not in the default list: add them with
``--methods`` (e.g. ``--methods ppo ppo_l2_init ppo_spectral ppo_nap plastic_relu plastic_maxmin``) to build
the paper's comparison table.

Layout of ``--out`` (default ``bench/results/continual/<setting>``)::

    runs/<method>/seed<k>.json     one finished run (its per-task results and timings)
    tb/<method>/s<k>_1/            its TensorBoard events (SB3's logger + PlasticityMonitor)
    summary.json, end_of_task.png  the grid's table and the key plot
    plots/                         sb3-plastic plot output: return curve, diagnostics over the run

Resuming: a run whose JSON exists is skipped, so rerunning the same command after an interruption
finishes the grid (an unfinished run is started again from scratch; its partial TensorBoard folder is
removed first). ``--plot-only`` rebuilds the table and plots from what exists.

Examples::

    python bench/continual.py --quick                                    # smoke test, ~1-2 min
    python bench/continual.py --seeds 0 1 2 --jobs 2                     # the CPU grid of bench/README.md
    python bench/continual.py --tasks 20 --seeds 0 1 --jobs 14          # larger, on a many-core machine
    python bench/continual.py --setting minatar --device cuda --jobs 4   # permuted MinAtar on a GPU
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

import numpy as np

#: fraction of each task (its last part) over which the end-of-task reward is averaged
TAIL = 0.2


@dataclass(frozen=True)
class Setting:
    """A non-stationary env and the PPO hyperparameters every method shares on it.

    :param env_id: gymnasium id (``sb3_plastic/...``).
    :param change_every: task length in env steps of one env copy (total steps per task: ``x n_envs``).
    :param tasks: number of tasks of a run.
    :param n_envs: env copies (``make_vec_env``; they switch tasks in lockstep).
    :param policy: SB3 policy alias.
    :param net_arch: hidden layers of the policy and value MLPs.
    :param ppo: PPO keywords shared by every method.
    :param monitor_every: env steps between two PlasticityMonitor passes.
    :param env_kwargs: extra keywords of the env.
    :param description: one line for the README and the plots.
    """

    env_id: str
    change_every: int
    tasks: int
    n_envs: int
    policy: str
    net_arch: tuple[int, ...]
    ppo: dict[str, Any]
    monitor_every: int
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    @property
    def task_timesteps(self) -> int:
        return self.change_every * self.n_envs

    @property
    def total_timesteps(self) -> int:
        return self.tasks * self.task_timesteps


SETTINGS: dict[str, Setting] = {
    # random-label memorisation as RL: 256 fixed contexts, 8 actions, labels re-drawn every task
    "bandit": Setting(
        env_id="sb3_plastic/RandomLabelBandit-v0",
        change_every=2_000,
        tasks=12,
        n_envs=16,
        policy="MlpPolicy",
        net_arch=(128, 128),
        ppo=dict(n_steps=64, batch_size=256, n_epochs=10, learning_rate=1e-3, gamma=0.0, gae_lambda=1.0, ent_coef=0.0),
        monitor_every=16_000,
        description="RandomLabelBandit (256 contexts, 8 actions, labels re-drawn every 32k steps), PPO [128, 128]",
    ),
    # channel-permuted MinAtar Breakout, short task cycles
    "minatar": Setting(
        env_id="sb3_plastic/PermutedMinAtar-Breakout-v0",
        change_every=25_000,
        tasks=8,
        n_envs=8,
        policy="CnnPolicy",
        net_arch=(),
        ppo=dict(n_steps=128, batch_size=256, n_epochs=4, learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01),
        monitor_every=50_000,
        description="PermutedMinAtar-Breakout (channels permuted every 200k steps), PPO MinAtar CNN",
    ),
}

METHODS = ("ppo", "ppo_l2", "ppo_snp", "ppo_cbp", "ppo_fire", "ppo_fire_switch", "plastic_relu", "plastic_maxmin")
#: The isometry paper's baselines (issue #15), on request (``--methods``).
BASELINE_METHODS = ("ppo_l2_init", "ppo_spectral", "ppo_nap")
METHODS = METHODS + BASELINE_METHODS
DEFAULT_METHODS = tuple(m for m in METHODS if m != "ppo_fire_switch" and m not in BASELINE_METHODS)


@dataclass(frozen=True)
class MethodParams:
    """Hyperparameters of the methods (flags of the script; the defaults are the ones of bench/README.md).

    :param l2: Adam ``weight_decay`` of ``ppo_l2``.
    :param shrink: ``lambda`` of Shrink & Perturb (event form).
    :param perturb: ``p`` of Shrink & Perturb.
    :param cbp_rate: Continual Backprop replacement rate per optimizer step.
    :param cbp_maturity: Continual Backprop maturity threshold (optimizer steps).
    :param isometry_coef: ``lambda`` of the isometry penalty (AdamO) of the plastic methods.
    :param l2_init_coef: ``lambda`` of ``ppo_l2_init``.
    :param spectral_coef: ``lambda`` of ``ppo_spectral``.
    :param fire_head_scale: ``head_scale`` of the FIRE methods (``"init"``, the library default, or ``"reference"``).
    :param fire_iterations: ``iterations`` of the FIRE methods: 0 for the library default (the exact polar factor),
        ``k`` for ``k`` Newton–Schulz steps (10: the reference implementation).
    :param isometry_interval: ``isometry_interval`` of the plastic methods: an int ``k`` or ``"auto"``
        (``"1"``: the exact per-update AdamO step, the library default).
    """

    l2: float = 1e-3
    shrink: float = 0.4
    perturb: float = 0.1
    cbp_rate: float = 1e-4
    cbp_maturity: int = 100
    isometry_coef: float = 0.1
    l2_init_coef: float = 1e-3
    spectral_coef: float = 1e-3
    fire_head_scale: str = "init"
    fire_iterations: int = 0
    isometry_interval: str = "1"


# ------------------------------------------------------------------------------------------- one run
def _task_recorder(setting: Setting, results: dict[str, list[float]], progress_path: Optional[str] = None) -> Any:
    """A callback accumulating, per task of env copy 0's ``info["task_id"]``, the mean reward per env step
    over the task and over its last ``TAIL`` part; writes ``continual/...`` keys to SB3's logger at each task end."""
    from stable_baselines3.common.callbacks import BaseCallback

    tail_start = round((1.0 - TAIL) * setting.change_every)

    class TaskRecorder(BaseCallback):
        def _on_training_start(self) -> None:
            self._task: Optional[int] = None
            self._sums = np.zeros(2)
            self._counts = np.zeros(2)

        def _close_task(self) -> None:
            if self._task is None or self._counts[0] == 0 or self._task >= setting.tasks:
                return  # (the last rollout may run a few steps into a task past the schedule)
            mean = float(self._sums[0] / self._counts[0])
            end = float(self._sums[1] / self._counts[1]) if self._counts[1] else float("nan")
            results["task"].append(self._task)
            results["mean_reward"].append(mean)
            results["end_reward"].append(end)
            self.logger.record("continual/end_of_task_reward", end)
            self.logger.record("continual/task_mean_reward", mean)
            self.logger.record("continual/task", self._task)
            if progress_path:  # what an interrupted run had reached (never read as a finished run)
                with open(progress_path, "w") as f:
                    json.dump(results, f)

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]
            task = int(info.get("task_id", 0))
            if task != self._task:
                self._close_task()
                self._task, self._sums[:], self._counts[:] = task, 0.0, 0.0
            rewards = np.asarray(self.locals["rewards"], dtype=np.float64)
            self._sums[0] += rewards.sum()
            self._counts[0] += rewards.size
            if int(info.get("task_step", 0)) > tail_start:
                self._sums[1] += rewards.sum()
                self._counts[1] += rewards.size
            return True

        def _on_training_end(self) -> None:
            self._close_task()

    return TaskRecorder()


def build_model(method: str, setting: Setting, params: MethodParams, seed: int, device: str, tb_dir: Optional[str]) -> Any:
    """The agent of ``method`` and the callbacks it trains with (besides the monitor and the recorder)."""
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    import sb3_plastic.envs  # noqa: F401  (registers the ids)
    from sb3_plastic import FIRE, ContinualBackprop, L2Init, PlasticPPO, ShrinkPerturb, SpectralRegularisation

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
    env = make_vec_env(
        setting.env_id,
        n_envs=setting.n_envs,
        seed=seed,
        env_kwargs=dict(change_every=setting.change_every, **setting.env_kwargs),
    )
    common = dict(setting.ppo, seed=seed, device=device, tensorboard_log=tb_dir, verbose=0)
    net_arch = list(setting.net_arch)
    callbacks: list[Any] = []
    if method.startswith("plastic_"):
        activation = method.removeprefix("plastic_")
        model = PlasticPPO(
            setting.policy,
            env,
            activation=activation,
            isometry_coef=params.isometry_coef,
            isometry_interval="auto" if params.isometry_interval == "auto" else int(params.isometry_interval),
            policy_kwargs=dict(net_arch=net_arch),
            **common,
        )
        return model, callbacks
    if method == "ppo_nap":
        nap = dict(activation="relu", isometry_mode="off", optimizer="adam", nap=True)
        return PlasticPPO(setting.policy, env, policy_kwargs=dict(net_arch=net_arch), **nap, **common), callbacks
    policy_kwargs: dict[str, Any] = dict(net_arch=net_arch, activation_fn=th.nn.ReLU)
    if method == "ppo_l2":
        policy_kwargs["optimizer_kwargs"] = dict(eps=1e-5, weight_decay=params.l2)
    model = PPO(setting.policy, env, policy_kwargs=policy_kwargs, **common)
    if method == "ppo_snp":
        callbacks.append(ShrinkPerturb("event", shrink=params.shrink, perturb=params.perturb, on_task_change=True))
    elif method == "ppo_l2_init":
        callbacks.append(L2Init(params.l2_init_coef))
    elif method == "ppo_spectral":
        callbacks.append(SpectralRegularisation(params.spectral_coef))
    elif method == "ppo_cbp":
        callbacks.append(ContinualBackprop(replacement_rate=params.cbp_rate, maturity_threshold=params.cbp_maturity))
    elif method in ("ppo_fire", "ppo_fire_switch"):
        fire = dict(head_scale=params.fire_head_scale, iterations=params.fire_iterations or None)
        trigger = dict(at=0.5) if method == "ppo_fire" else dict(at=None, on_task_change=True)
        callbacks.append(FIRE(**trigger, **fire))
    return model, callbacks


def run_one(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str, threads: int) -> dict:
    """Train one (method, seed) run and write ``runs/<method>/seed<k>.json``; returns its record."""
    import torch as th

    from sb3_plastic import PlasticityMonitor

    th.set_num_threads(threads)
    tb_root = os.path.join(out, "tb", method)
    for stale in (d for d in (os.listdir(tb_root) if os.path.isdir(tb_root) else []) if d.startswith(f"s{seed}_")):
        shutil.rmtree(os.path.join(tb_root, stale))  # an interrupted attempt
    start = time.time()
    cpu_start = time.process_time()
    model, callbacks = build_model(method, setting, params, seed, device, tb_root)
    results: dict[str, list[float]] = {"task": [], "mean_reward": [], "end_reward": []}
    monitor = PlasticityMonitor(every=setting.monitor_every, max_overhead=None)
    os.makedirs(os.path.join(out, "runs", method), exist_ok=True)
    path = os.path.join(out, "runs", method, f"seed{seed}.json")
    recorder = _task_recorder(setting, results, path.replace(".json", ".progress"))
    model.learn(setting.total_timesteps, callback=[*callbacks, monitor, recorder], tb_log_name=f"s{seed}")
    record = {
        "method": method,
        "seed": seed,
        "setting": asdict(setting),
        "params": asdict(params),
        "device": str(model.device),
        "timesteps": int(model.num_timesteps),
        "wall_seconds": time.time() - start,
        "cpu_seconds": time.process_time() - cpu_start,
        **results,
    }
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # a JSON that exists is a finished run
    return record


def _run_job(job: tuple) -> tuple[str, int, float, Optional[str]]:
    method, seed, setting, params, out, device, threads = job
    start = time.time()
    try:
        run_one(method, seed, setting, params, out, device, threads)
        return method, seed, time.time() - start, None
    except Exception as exc:  # reported, the grid goes on
        return method, seed, time.time() - start, f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------- the grid
def load_records(out: str) -> list[dict]:
    records = []
    root = os.path.join(out, "runs")
    for method in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for name in sorted(os.listdir(os.path.join(root, method))):
            if name.endswith(".json"):
                with open(os.path.join(root, method, name)) as f:
                    records.append(json.load(f))
    return records


def summarise(records: list[dict], methods: list[str]) -> dict[str, Any]:
    """Per method: end-of-task reward per task (mean / min / max over seeds) and three summary numbers:
    task 0 (fresh agent), mean over the last half of the tasks, and their ratio (1: no loss of plasticity)."""
    summary: dict[str, Any] = {}
    for method in methods:
        runs = [r for r in records if r["method"] == method]
        if not runs:
            continue
        n = min(len(r["end_reward"]) for r in runs)
        ends = np.array([r["end_reward"][:n] for r in runs])  # seeds x tasks
        first = ends[:, 0]
        last_half = ends[:, n // 2 :].mean(axis=1)
        summary[method] = {
            "seeds": [r["seed"] for r in runs],
            "end_reward_mean": ends.mean(axis=0).tolist(),
            "end_reward_min": ends.min(axis=0).tolist(),
            "end_reward_max": ends.max(axis=0).tolist(),
            "task0": float(first.mean()),
            "last_half": float(last_half.mean()),
            "last_half_per_seed": last_half.tolist(),
            "retained": float(last_half.mean() / first.mean()) if first.mean() > 0 else float("nan"),
            "wall_seconds_mean": float(np.mean([r["wall_seconds"] for r in runs])),
            "cpu_seconds_mean": float(np.mean([r["cpu_seconds"] for r in runs])),
            "device": runs[0]["device"],
        }
    return summary


def print_table(summary: dict[str, Any], setting_name: str) -> None:
    if not summary:
        print("no finished runs")
        return
    n_tasks = len(next(iter(summary.values()))["end_reward_mean"])
    shown = sorted({0, 1, 2, n_tasks // 2, n_tasks - 1} & set(range(n_tasks)))
    head = (
        ["method", "seeds"] + [f"task {k}" for k in shown] + ["last half", "last half / task 0", "min / run", "cpu min / run"]
    )
    rows = []
    for method, s in summary.items():
        rows.append(
            [method, str(len(s["seeds"]))]
            + [f"{s['end_reward_mean'][k]:.3f}" for k in shown]
            + [
                f"{s['last_half']:.3f} ({min(s['last_half_per_seed']):.3f}-{max(s['last_half_per_seed']):.3f})",
                f"{s['retained']:.2f}",
                f"{s['wall_seconds_mean'] / 60:.1f}",
                f"{s['cpu_seconds_mean'] / 60:.1f}",
            ]
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print(
        f"end-of-task reward per env step (mean over the last {TAIL:.0%} of each task; mean over seeds), "
        f"setting={setting_name}"
    )
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


def plot_end_of_task(summary: dict[str, Any], path: str, title: str) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(11, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for method, s in summary.items():
        y = np.array(s["end_reward_mean"])
        x = np.arange(len(y))
        (line,) = ax.plot(x, y, marker="o", markersize=3, label=f"{method} ({len(s['seeds'])} seeds)")
        ax.fill_between(x, s["end_reward_min"], s["end_reward_max"], color=line.get_color(), alpha=0.15)
    ax.set_xlabel("task")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"reward per env step, last {TAIL:.0%} of the task")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def report(out: str, setting_name: str, setting: Setting, methods: list[str], diagnostics: bool = True) -> dict[str, Any]:
    """Table on stdout, ``summary.json``, ``end_of_task.png`` and (``diagnostics``) the plots of
    :func:`sb3_plastic.plot.plot_runs` under ``plots/``."""
    records = load_records(out)
    summary = summarise(records, methods)
    print_table(summary, setting_name)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"setting": setting_name, "tail": TAIL, "methods": summary}, f, indent=1)
    if summary:
        print("wrote", plot_end_of_task(summary, os.path.join(out, "end_of_task.png"), setting.description))
    if diagnostics and summary:
        from sb3_plastic.plot import plot_runs

        metrics = [
            "plasticity/policy/dormant_fraction",
            "plasticity/policy/ntk_cond",
            "plasticity/policy/ntk_erank",
            "plasticity/policy/dfi",
            "plasticity/policy/weight_norm",
            "plasticity/policy/*/effective_rank",
            "continual/end_of_task_reward",
            "train/entropy_loss",
        ]
        paths = [os.path.join(out, "tb", m) for m in methods if os.path.isdir(os.path.join(out, "tb", m))]
        plots = os.path.join(out, "plots")
        # one curve per method folder tb/<method>/ (the plain-PPO methods differ only in their callbacks)
        group_by = r"/tb/([^/]+)/[^/]+$"
        for written in plot_runs(paths, plots, metrics=metrics, switch_every=setting.task_timesteps, group_by=group_by):
            print("wrote", written)
    return summary


def parse_ppo_kwargs(items: list[str]) -> dict[str, Any]:
    """``["ent_coef=0.01", ...]`` -> ``{"ent_coef": 0.01}``; a key PPO does not take is a ``ValueError``."""
    import inspect

    import yaml
    from stable_baselines3 import PPO

    ignored = {"self", "policy", "env", "policy_kwargs", "seed", "device"}
    allowed = {k for k in inspect.signature(PPO.__init__).parameters if k not in ignored and not k.startswith("_")}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ValueError(
                f"--ppo-kwarg expects KEY=VALUE with KEY a PPO keyword ({', '.join(sorted(allowed))}), got {item!r}"
            )
        out[key] = yaml.safe_load(value)
    return out


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", choices=sorted(SETTINGS), default="bandit")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(DEFAULT_METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--tasks", type=int, help="number of tasks (default: the setting's)")
    p.add_argument("--change-every", type=int, help="task length in env steps per env copy (default: the setting's)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--device", default="cpu", help="torch device of the agents: cpu, cuda, auto")
    p.add_argument("--out", help="output folder (default bench/results/continual/<setting>[_quick])")
    p.add_argument("--quick", action="store_true", help="2 short tasks, one seed: a smoke test (~1 min)")
    p.add_argument(
        "--ppo-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a PPO keyword of the setting for every method, e.g. ent_coef=0.01 (repeatable; VALUE read as yaml)",
    )
    p.add_argument("--plot-only", action="store_true", help="only rebuild the table and plots")
    p.add_argument("--no-diagnostics-plots", action="store_true", help="skip the plots of the TensorBoard diagnostics")
    for f in MethodParams.__dataclass_fields__.values():
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    args = p.parse_args(argv)
    try:
        args.ppo_overrides = parse_ppo_kwargs(args.ppo_kwarg)
    except ValueError as exc:
        p.error(str(exc))
    for name in ("tasks", "change_every", "jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    setting = SETTINGS[args.setting]
    if args.quick:
        setting = replace(
            setting, tasks=2, change_every=max(setting.change_every // 16, 64), monitor_every=setting.change_every
        )
        if args.seeds == [0, 1, 2]:
            args.seeds = [0]
    if args.tasks is not None:
        setting = replace(setting, tasks=args.tasks)
    if args.change_every is not None:
        setting = replace(setting, change_every=args.change_every)
    if args.ppo_overrides:
        setting = replace(setting, ppo={**setting.ppo, **args.ppo_overrides})
    params = MethodParams(**{f: getattr(args, f) for f in MethodParams.__dataclass_fields__})
    out = args.out or os.path.join("bench", "results", "continual", args.setting + ("_quick" if args.quick else ""))
    os.makedirs(out, exist_ok=True)
    print(
        f"setting={args.setting}: {setting.description}; {setting.tasks} tasks x {setting.task_timesteps} env steps "
        f"({setting.change_every} per copy x {setting.n_envs} copies), methods={' '.join(args.methods)}, "
        f"seeds={' '.join(map(str, args.seeds))}, device={args.device}, jobs={args.jobs}, out={out}",
        flush=True,
    )
    if not args.plot_only:
        done = {(r["method"], r["seed"]) for r in load_records(out)}
        jobs = [
            (m, s, setting, params, out, args.device, args.threads)
            for s in args.seeds
            for m in args.methods
            if (m, s) not in done
        ]
        skipped = len(args.methods) * len(args.seeds) - len(jobs)
        if skipped:
            print(f"resuming: {skipped} finished runs skipped", flush=True)
        failures = []
        start = time.time()
        if args.jobs == 1:
            outcomes = map(_run_job, jobs)
        else:
            pool = futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"))
            outcomes = (f.result() for f in futures.as_completed([pool.submit(_run_job, j) for j in jobs]))
        for method, seed, seconds, error in outcomes:
            status = "FAILED " + error if error else "done"
            print(
                f"[{time.time() - start:7.0f}s] {method} seed {seed}: {status} ({seconds / 60:.1f} min)",
                file=sys.stderr,
                flush=True,
            )
            if error:
                failures.append((method, seed, error))
        if args.jobs != 1:
            pool.shutdown()
        if failures:
            print(f"{len(failures)} runs failed: {failures}", flush=True)
    report(out, args.setting, setting, args.methods, diagnostics=not args.no_diagnostics_plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
