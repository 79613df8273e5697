"""Stationary "do no harm" benchmark (issue #12): the plastic classes at their library defaults against SB3.

A plastic agent must learn a stationary task as well as SB3 does. Every cell of this benchmark trains the
same algorithm twice per seed, with the same hyperparameters (rl_zoo3's where it has them):

* arm ``sb3``: the Stable-Baselines3 / sb3-contrib class (``PPO``, ``SAC``, ``MaskablePPO``),
* arm ``plastic``: the sb3-plastic class (``PlasticPPO``, ``PlasticSAC``, ``PlasticMaskablePPO``) with **no
  plastic keyword**: whatever the library's defaults (activation, initialisation, optimizer, isometry
  coefficient) are when the run starts. Each run records what they resolved to (``model.isometry_config``,
  the activation of every part of the policy, the optimizer and its isometry settings, the git commit).

Settings (``--settings``; all by default):

====================  ======================================================================================
``cartpole_ppo``      CartPole-v1, PPO MlpPolicy, rl_zoo3's hyperparameters (8 envs, n_steps 32, batch 256,
                      gae_lambda 0.8, gamma 0.98, 20 epochs, ent_coef 0, lr lin 1e-3, clip lin 0.2), 1e5 steps
``pendulum_sac``      Pendulum-v1, SAC MlpPolicy, rl_zoo3's hyperparameters (lr 1e-3, SAC's defaults otherwise),
                      20 000 steps
``breakout_ppo``      MinAtar/Breakout-v1 (``minatar.gym.register_envs()``), PPO CnnPolicy with rl_zoo3's Atari
                      PPO settings (8 envs, n_steps 128, batch 256, 4 epochs, lr lin 2.5e-4, clip lin 0.1,
                      ent_coef 0.01, vf_coef 0.5). SB3's NatureCNN cannot take 10x10 boolean frames, so the SB3
                      arm gets the network the plastic default builds (:class:`sb3_plastic.networks.PlasticCNN`,
                      MinAtar architecture, same activation, same ``net_arch``) through
                      ``features_extractor_class``: only the plasticity machinery differs. Episodes are cut at
                      5 000 steps (MinAtar sets no limit; a good deterministic policy could play for ever).
``masked_identity``   sb3-contrib's MaskablePPO performance test (tests/test_invalid_actions.py::test_identity:
                      InvalidActionEnvDiscrete(dim=70, n_invalid_actions=55), gamma 0.4, 3000 steps, 20
                      deterministic evaluation episodes, threshold 90), MaskablePPO vs PlasticMaskablePPO, on
                      ``sb3_plastic/InvalidActionDiscrete-v0`` (the same env with a seeded generator)
====================  ======================================================================================

Every run: model seed ``k``, a separate evaluation env seeded ``10_000 + k`` (paired: both arms see the same
evaluation episodes' seeds), a learning curve (``curve_episodes`` deterministic episodes every ``eval_every``
env steps) and the final return: the mean return of ``final_episodes`` deterministic evaluation episodes.
One torch thread per process (``OMP_NUM_THREADS=1`` is set before torch is imported).

Statistics per cell (``summarise``): mean and min-max per arm, the paired difference plastic - SB3 per seed
and a percentile bootstrap 95 % CI of its mean (resampling seeds, 20 000 resamples); the margin of a
"meaningful loss" is ``MARGIN`` = 5 % of what SB3 learned above a uniformly random policy
(``0.05 * (mean_sb3 - random)``, ``random`` measured on the same evaluation env: ``<setting>/random.json``).
Verdicts: "no harm resolved" when the CI's lower end is above ``-margin``, "harm" when its upper end is below
``-margin``, else "not resolved". The IQM of each arm (rliable's ``aggregate_iqm``) with a stratified bootstrap
CI, and an aggregate over all cells of the SB3-normalised score ``(x - random) / (mean_sb3 - random)``.

Layout of ``--out`` (default ``bench/results/stationary``)::

    <setting>/<arm>_seed<k>.json    one finished run (return, curve, wall / CPU time, resolved config)
    <setting>/random.json           the random policy's return on the evaluation env
    summary.json, summary.md        the table (rebuilt from the per-run files by ``--summarise``)
    curves.png                      learning curves of both arms per cell (mean, min-max band over paired seeds)

Resuming: a run whose JSON exists is skipped (``--force`` reruns it).

Which library: by default the working tree's sb3_plastic. ``--library-commit REV`` imports it from a snapshot of
a commit (``git archive`` into ``$TMPDIR/sb3_plastic_snapshots/<commit>``), so runs measure committed defaults
even while the working tree holds other uncommitted edits; every run file records which one it used.

Examples::

    python bench/stationary.py --quick --out /tmp/st                 # smoke test: masked identity, 2 x 256 steps
    python bench/stationary.py --settings cartpole_ppo --arms sb3 --seeds 0 1 2 3 4
    python bench/stationary.py --summarise                           # table from the committed per-run files
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import ast
import dataclasses
import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results" / "stationary"
ARMS = ("sb3", "plastic")
#: a meaningful loss: this fraction of what SB3 learned above a random policy
MARGIN = 0.05
#: fewer paired seeds than this give no verdict
MIN_SEEDS = 5
N_BOOT = 20_000
EVAL_SEED_OFFSET = 10_000
RANDOM_SEED = 99_999
MINATAR_MAX_STEPS = 5_000
SNAPSHOT_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / "sb3_plastic_snapshots"


@dataclass(frozen=True)
class Setting:
    """One cell: an env, an algorithm pair and the hyperparameters both arms share.

    :param env_id: gymnasium id.
    :param algo: "ppo", "sac" or "maskable_ppo" (selects the SB3 and the plastic class).
    :param policy: policy alias.
    :param timesteps: training budget (env steps, all env copies together).
    :param hyperparams: keywords of the algorithm; ``"lin_<x>"`` strings become linear schedules.
    :param n_envs: env copies (``make_vec_env``).
    :param env_kwargs: keywords of ``gym.make``.
    :param eval_every: env steps between two learning-curve evaluations (0: no curve).
    :param curve_episodes: episodes per learning-curve evaluation.
    :param final_episodes: episodes of the final evaluation.
    :param max_episode_steps: a ``TimeLimit`` on the train and eval envs (None: the env's own).
    :param masked: evaluate with action masks (sb3-contrib's ``evaluate_policy``).
    :param note: one line for the table.
    """

    env_id: str
    algo: str
    policy: str
    timesteps: int
    hyperparams: dict[str, Any] = field(default_factory=dict)
    n_envs: int = 1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_every: int = 0
    curve_episodes: int = 5
    final_episodes: int = 20
    max_episode_steps: Optional[int] = None
    masked: bool = False
    note: str = ""


SETTINGS: dict[str, Setting] = {
    "cartpole_ppo": Setting(
        env_id="CartPole-v1",
        algo="ppo",
        policy="MlpPolicy",
        timesteps=100_000,
        n_envs=8,
        hyperparams=dict(
            n_steps=32,
            batch_size=256,
            gae_lambda=0.8,
            gamma=0.98,
            n_epochs=20,
            ent_coef=0.0,
            learning_rate="lin_0.001",
            clip_range="lin_0.2",
        ),
        eval_every=10_000,
        note="rl_zoo3 ppo.yml CartPole-v1",
    ),
    "pendulum_sac": Setting(
        env_id="Pendulum-v1",
        algo="sac",
        policy="MlpPolicy",
        timesteps=20_000,
        hyperparams=dict(learning_rate=1e-3),
        eval_every=2_000,
        note="rl_zoo3 sac.yml Pendulum-v1",
    ),
    "breakout_ppo": Setting(
        env_id="MinAtar/Breakout-v1",
        algo="ppo",
        policy="CnnPolicy",
        timesteps=300_000,
        n_envs=8,
        hyperparams=dict(
            n_steps=128,
            batch_size=256,
            n_epochs=4,
            learning_rate="lin_2.5e-4",
            clip_range="lin_0.1",
            ent_coef=0.01,
            vf_coef=0.5,
        ),
        eval_every=25_000,
        max_episode_steps=MINATAR_MAX_STEPS,
        note="rl_zoo3 ppo.yml Atari settings, PlasticCNN (MinAtar) in both arms",
    ),
    "masked_identity": Setting(
        env_id="sb3_plastic/InvalidActionDiscrete-v0",
        algo="maskable_ppo",
        policy="MlpPolicy",
        timesteps=3_000,
        env_kwargs=dict(dim=70, n_invalid_actions=55),
        hyperparams=dict(gamma=0.4),
        eval_every=1_000,
        masked=True,
        note="sb3-contrib test_invalid_actions.py::test_identity (threshold 90)",
    ),
}
#: the smallest setting, a few hundred steps: what ``--quick`` and the smoke test run
QUICK_SETTING = "masked_identity"
QUICK_OVERRIDES = dict(timesteps=256, hyperparams=dict(gamma=0.4, n_steps=128, batch_size=64, n_epochs=2), eval_every=128,
                       curve_episodes=1, final_episodes=2)


# ----------------------------------------------------------------------------------------------------- runs
def _classes(algo: str) -> tuple[type, type]:
    if algo == "ppo":
        from stable_baselines3 import PPO

        from sb3_plastic import PlasticPPO

        return PPO, PlasticPPO
    if algo == "sac":
        from stable_baselines3 import SAC

        from sb3_plastic import PlasticSAC

        return SAC, PlasticSAC
    if algo == "maskable_ppo":
        from sb3_contrib import MaskablePPO

        from sb3_plastic import PlasticMaskablePPO

        return MaskablePPO, PlasticMaskablePPO
    raise ValueError(f"unknown algo {algo!r}")


def _register_envs(env_id: str) -> None:
    import sb3_plastic.envs  # noqa: F401  (registers sb3_plastic/...)

    if env_id.startswith("MinAtar/"):
        import gymnasium as gym
        import minatar.gym

        if env_id not in gym.registry:
            minatar.gym.register_envs()


def make_env(setting: Setting) -> Any:
    """One gymnasium env of the setting (``TimeLimit`` applied when the setting asks for one)."""
    import gymnasium as gym

    _register_envs(setting.env_id)
    kwargs = dict(setting.env_kwargs)
    if setting.max_episode_steps is not None:
        kwargs["max_episode_steps"] = setting.max_episode_steps
    return gym.make(setting.env_id, **kwargs)


def _hyperparams(setting: Setting) -> dict[str, Any]:
    from stable_baselines3.common.utils import LinearSchedule

    out: dict[str, Any] = {}
    for key, value in setting.hyperparams.items():
        if isinstance(value, str) and value.startswith("lin_"):
            value = LinearSchedule(float(value[4:]), 0.0, 1.0)
        out[key] = value
    return out


def evaluate(model: Any, env: Any, n_episodes: int, masked: bool) -> list[float]:
    """Returns of ``n_episodes`` deterministic episodes on ``env`` (a 1-env VecEnv with a Monitor)."""
    if masked:
        from sb3_contrib.common.maskable.evaluation import evaluate_policy as masked_evaluate

        returns, _ = masked_evaluate(model, env, n_eval_episodes=n_episodes, deterministic=True,
                                     return_episode_rewards=True, warn=False)
    else:
        from stable_baselines3.common.evaluation import evaluate_policy

        returns, _ = evaluate_policy(model, env, n_eval_episodes=n_episodes, deterministic=True,
                                     return_episode_rewards=True, warn=False)
    return [float(r) for r in returns]


def _eval_env(setting: Setting, seed: int) -> Any:
    from stable_baselines3.common.env_util import make_vec_env

    return make_vec_env(lambda: make_env(setting), n_envs=1, seed=seed)


def random_return(setting: Setting, n_episodes: int) -> list[float]:
    """Returns of a uniformly random policy (a random valid action where the env masks actions)."""
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(make_env(setting))
    env.action_space.seed(RANDOM_SEED)
    rng = np.random.default_rng(RANDOM_SEED)
    returns = []
    env.reset(seed=RANDOM_SEED)
    while len(returns) < n_episodes:
        if setting.masked:
            mask = np.asarray(env.get_wrapper_attr("action_masks")())
            action = int(rng.choice(np.flatnonzero(mask)))
        else:
            action = env.action_space.sample()
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            env.reset()
    env.close()
    return returns


def _activation_names(module: Any) -> list[str]:
    """Class names of the activation modules inside ``module``, in order, without repeats."""
    import torch.nn as nn

    names: list[str] = []
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Conv2d, nn.Sequential, nn.Flatten, nn.Identity)) or sub is module:
            continue
        if len(list(sub.children())) == 0 and not list(sub.parameters(recurse=False)):
            name = type(sub).__name__
            if name not in names:
                names.append(name)
    return names


def resolved_config(model: Any) -> dict[str, Any]:
    """What the model's defaults resolved to: activations per part, optimizer, isometry settings, init."""
    policy = model.policy
    out: dict[str, Any] = {
        "algorithm": type(model).__name__,
        "policy": type(policy).__name__,
        "activation_fn": getattr(getattr(policy, "activation_fn", None), "__name__", None),
        "net_arch": getattr(policy, "net_arch", None),
        "ortho_init": getattr(policy, "ortho_init", None),
        "optimizer_class": getattr(getattr(policy, "optimizer_class", None), "__name__", None),
        "optimizer_kwargs": {k: v for k, v in (getattr(policy, "optimizer_kwargs", None) or {}).items()
                             if isinstance(v, (int, float, str, bool, tuple, list, type(None)))},
        "parts": {},
    }
    parts = {}
    for name in ("features_extractor", "pi_features_extractor", "mlp_extractor", "actor", "critic", "q_net"):
        part = getattr(policy, name, None)
        if part is not None:
            parts[name] = _activation_names(part)
    out["parts"] = parts
    fe = getattr(policy, "features_extractor", None)
    if fe is not None:
        out["features_extractor_class"] = type(fe).__name__
        out["features_extractor_arch"] = getattr(fe, "arch", None)
        out["features_dim"] = getattr(fe, "features_dim", None)
    if hasattr(model, "isometry_config"):
        out["isometry_config"] = dataclasses.asdict(model.isometry_config)
        out["use_orthogonal_init"] = bool(model.isometry_config.use_orthogonal_init)
    return out


def params_hash(module: Any) -> str:
    """SHA-1 of a module's parameters and buffers (names, shapes, values): equal hashes = identical networks."""
    import hashlib

    digest = hashlib.sha1()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20, check=True).stdout
        return out.rstrip("\n")  # not strip(): porcelain lines start with a status column that may be a space
    except (OSError, subprocess.SubprocessError):
        return ""


#: ``--plastic-kwarg`` (ablations only, never in the default output folder): keywords added to the plastic arm
PLASTIC_OVERRIDES: dict[str, Any] = {}
#: set by ``use_library_commit``: the commit whose sb3_plastic the runs import
LIBRARY_COMMIT: Optional[str] = None


def use_library_commit(rev: str, cache: Path = SNAPSHOT_CACHE) -> Path:
    """Import sb3_plastic from commit ``rev`` instead of the working tree (where other engineers' uncommitted
    edits live): ``git archive`` of ``sb3_plastic/``, ``envs/`` and ``zoo_configs/`` into ``cache/<commit>``,
    laid out as the installed package (``sb3_plastic.envs``), put first on ``sys.path``."""
    global LIBRARY_COMMIT
    commit = _git("rev-parse", "--short=10", f"{rev}^{{commit}}")
    if not commit:
        raise SystemExit(f"--library-commit: unknown revision {rev!r}")
    target = cache / commit
    if not (target / "sb3_plastic" / "__init__.py").exists():
        tmp = cache / f"{commit}.tmp{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", commit, "sb3_plastic", "envs", "zoo_configs"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        for sub in ("envs", "zoo_configs"):
            if (tmp / sub).is_dir():
                (tmp / sub).rename(tmp / "sb3_plastic" / sub)
        try:
            tmp.rename(target)
        except OSError:  # another process made it first
            pass
    if "sb3_plastic" in sys.modules:
        raise RuntimeError("use_library_commit must run before sb3_plastic is imported")
    sys.path.insert(0, str(target))
    import sb3_plastic

    assert Path(sb3_plastic.__file__).resolve().is_relative_to(target.resolve()), sb3_plastic.__file__
    LIBRARY_COMMIT = commit
    return target


def _git_state() -> dict[str, Any]:
    """Which sb3_plastic the run imported: a commit snapshot, or the working tree (HEAD + its uncommitted edits)."""
    if LIBRARY_COMMIT is not None:
        return {"commit": LIBRARY_COMMIT, "library": "snapshot of the commit", "dirty_library_files": []}
    dirty = _git("status", "--porcelain", "--", "sb3_plastic", "envs")
    return {
        "commit": _git("rev-parse", "--short=10", "HEAD"),
        "library": "working tree",
        "dirty_library_files": [line[3:] for line in dirty.splitlines()],
    }


def _plastic_cnn_network(setting: Setting) -> dict[str, Any]:
    """The CNN network the plastic default builds on this env: its extractor kwargs and ``net_arch``, so the
    SB3 arm can be given the very same network."""
    from stable_baselines3.common.env_util import make_vec_env

    _, plastic_cls = _classes(setting.algo)
    env = make_vec_env(lambda: make_env(setting), n_envs=setting.n_envs, seed=0)
    probe = plastic_cls(setting.policy, env, device="cpu", **_hyperparams(setting))
    policy = probe.policy
    fe = policy.features_extractor
    act_cls = type(fe.cnn[1])
    network = {
        "features_extractor_kwargs": dict(activation=act_cls, arch=fe.arch, features_dim=fe.features_dim),
        "net_arch": policy.net_arch,
        "activation_fn": policy.activation_fn,
    }
    env.close()
    return network


def build_model(setting: Setting, arm: str, seed: int, env: Any) -> tuple[Any, dict[str, Any]]:
    """The model of ``arm`` on ``env``; returns it and the network choices made for the SB3 arm (if any)."""
    sb3_cls, plastic_cls = _classes(setting.algo)
    kwargs = _hyperparams(setting)
    mirrored: dict[str, Any] = {}
    if arm == "plastic":
        return plastic_cls(setting.policy, env, seed=seed, device="cpu", **kwargs, **PLASTIC_OVERRIDES), mirrored
    if setting.policy == "CnnPolicy":
        from sb3_plastic.networks import PlasticCNN

        net = _plastic_cnn_network(setting)
        kwargs["policy_kwargs"] = dict(
            features_extractor_class=PlasticCNN,
            features_extractor_kwargs=net["features_extractor_kwargs"],
            net_arch=net["net_arch"],
            activation_fn=net["activation_fn"],
        )
        mirrored = {
            "features_extractor_class": "PlasticCNN",
            "features_extractor_kwargs": {k: getattr(v, "__name__", v) for k, v in net["features_extractor_kwargs"].items()},
            "net_arch": net["net_arch"],
            "activation_fn": net["activation_fn"].__name__,
        }
    return sb3_cls(setting.policy, env, seed=seed, device="cpu", **kwargs), mirrored


def run_one(setting_name: str, setting: Setting, arm: str, seed: int, out_dir: Path) -> dict[str, Any]:
    """Train one arm on one seed and write ``<out_dir>/<setting>/<arm>_seed<k>.json``."""
    import torch as th
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    th.set_num_threads(1)
    env = make_vec_env(lambda: make_env(setting), n_envs=setting.n_envs, seed=seed)
    eval_env = _eval_env(setting, EVAL_SEED_OFFSET + seed)
    model, mirrored = build_model(setting, arm, seed, env)
    init_hash = params_hash(model.policy)
    curve: list[list[float]] = []
    eval_seconds = [0.0]

    class Curve(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next_eval = setting.eval_every

        def _on_step(self) -> bool:
            if setting.eval_every and self.num_timesteps >= self.next_eval:
                start = time.perf_counter()
                returns = evaluate(self.model, eval_env, setting.curve_episodes, setting.masked)
                eval_seconds[0] += time.perf_counter() - start
                curve.append([int(self.num_timesteps), float(np.mean(returns))])
                while self.next_eval <= self.num_timesteps:
                    self.next_eval += setting.eval_every
            return True

    wall0, cpu0 = time.perf_counter(), time.process_time()
    model.learn(setting.timesteps, callback=Curve())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    start = time.perf_counter()
    # the final evaluation restarts the eval env from its seed: both arms see the same episode seeds
    eval_env.seed(EVAL_SEED_OFFSET + seed)
    returns = evaluate(model, eval_env, setting.final_episodes, setting.masked)
    final_eval_s = time.perf_counter() - start
    record = {
        "setting": setting_name,
        "arm": arm,
        "seed": seed,
        "env_id": setting.env_id,
        "timesteps": int(model.num_timesteps),
        "timesteps_requested": setting.timesteps,
        "final_return": float(np.mean(returns)),
        "final_return_std": float(np.std(returns)),
        "final_episode_returns": returns,
        "curve": curve,
        "wall_s": wall,
        "cpu_s": cpu,
        "eval_s_in_training": eval_seconds[0],
        "final_eval_s": final_eval_s,
        "fps_wall": model.num_timesteps / wall if wall > 0 else None,
        "setting_spec": _jsonable(dataclasses.asdict(setting)),
        "resolved": resolved_config(model),
        "initial_params_sha1": init_hash,
        "plastic_overrides": _jsonable(PLASTIC_OVERRIDES) if arm == "plastic" else {},
        "sb3_arm_network_from_plastic_default": mirrored or None,
        "git": _git_state(),
        "versions": _versions(),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    env.close()
    eval_env.close()
    path = out_dir / setting_name / f"{arm}_seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    return record


def backfill_init_hash(setting_name: str, setting: Setting, arm: str, seed: int, out_dir: Path) -> Optional[str]:
    """Add ``initial_params_sha1`` to a run file written before the field existed: the model is rebuilt at the
    run's seed (no training; the library must be the run's commit) and the file gets the hash and
    ``initial_params_sha1_backfilled: true``. Returns the hash, or None when nothing was done."""
    from stable_baselines3.common.env_util import make_vec_env

    path = out_dir / setting_name / f"{arm}_seed{seed}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    if record.get("initial_params_sha1"):
        return None
    if record["git"]["commit"] != _git_state()["commit"]:
        print(f"backfill skipped for {path}: run used {record['git']['commit']}, this process imports "
              f"{_git_state()['commit']}", flush=True)
        return None
    env = make_vec_env(lambda: make_env(setting), n_envs=setting.n_envs, seed=seed)
    model, _ = build_model(setting, arm, seed, env)
    record["initial_params_sha1"] = params_hash(model.policy)
    record["initial_params_sha1_backfilled"] = True
    env.close()
    path.write_text(json.dumps(record, indent=1))
    return record["initial_params_sha1"]


def _versions() -> dict[str, str]:
    import sb3_contrib
    import stable_baselines3
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "sb3": stable_baselines3.__version__,
            "sb3_contrib": sb3_contrib.__version__, "torch_threads": str(torch.get_num_threads())}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: getattr(v, "__name__", repr(v))))


def ensure_random(setting_name: str, setting: Setting, out_dir: Path) -> float:
    """The random policy's mean return on the setting's evaluation env (cached in ``<setting>/random.json``)."""
    path = out_dir / setting_name / "random.json"
    if path.exists():
        return float(json.loads(path.read_text())["mean"])
    returns = random_return(setting, max(setting.final_episodes, 20))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"setting": setting_name, "mean": float(np.mean(returns)), "returns": returns,
                                "policy": "uniformly random (a random valid action under masks)"}, indent=1))
    return float(np.mean(returns))


# ----------------------------------------------------------------------------------------------------- statistics
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rl_stats import bootstrap_mean_ci, iqm_ci, iqm_rows, rliable_metrics, stratified_bootstrap, t_mean_ci  # noqa: E402,F401

_metrics, _iqm_ci = rliable_metrics, iqm_ci  # the names this script used before the move


def verdict(ci: tuple[float, float], margin: float) -> str:
    """"no harm resolved" when the CI of plastic - SB3 lies above ``-margin``; "harm" when below; else "not resolved"."""
    lo, hi = ci
    if not np.isfinite(lo):
        return "not resolved"
    if lo > -margin:
        return "no harm resolved"
    if hi < -margin:
        return "harm"
    return "not resolved"


def load_runs(out_dir: Path) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """``runs[setting][arm][seed]`` from the per-run files."""
    runs: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for name in SETTINGS:
        folder = out_dir / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*_seed*.json")):
            record = json.loads(path.read_text())
            runs.setdefault(name, {}).setdefault(record["arm"], {})[int(record["seed"])] = record
    return runs


def _curve_mean(record: dict[str, Any]) -> Optional[float]:
    """Mean of the learning-curve evaluations of a run (an area under the curve: learning speed, not just the end)."""
    curve = record.get("curve") or []
    return float(np.mean([v for _, v in curve])) if curve else None


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _activation_summary(records: list[dict[str, Any]]) -> str:
    seen = []
    for record in records:
        res = record["resolved"]
        parts = res.get("parts", {})
        text = ", ".join(f"{k}: {'/'.join(v)}" for k, v in parts.items() if v and k not in ("pi_features_extractor",))
        iso = res.get("isometry_config")
        if iso:
            text += (f"; {iso['optimizer']}, coef {iso['isometry_coef']:g}, mode {iso['isometry_mode']}, "
                     f"interval {iso['isometry_interval']}, ortho init {res.get('use_orthogonal_init')}")
        else:
            text += f"; {res.get('optimizer_class')}"
        if text not in seen:
            seen.append(text)
    return " | ".join(seen)


def summarise(out_dir: Path, settings: Optional[list[str]] = None, write: bool = True) -> dict[str, Any]:
    """Build the table (and ``summary.json`` / ``summary.md``) from the per-run files under ``out_dir``."""
    runs = load_runs(out_dir)
    cells: dict[str, Any] = {}
    rows = []
    normalised: dict[str, list[dict[int, float]]] = {arm: [] for arm in ARMS}  # per cell: seed -> score
    for name, setting in SETTINGS.items():
        if (settings is not None and name not in settings) or name not in runs:
            continue
        by_arm = runs[name]
        cell: dict[str, Any] = {"env_id": setting.env_id, "note": setting.note, "arms": {}}
        paired = sorted(set(by_arm.get("sb3", {})) & set(by_arm.get("plastic", {})))
        for arm in ARMS:
            recs = by_arm.get(arm, {})
            if not recs:
                continue
            seeds = paired or sorted(recs)  # every number of a cell is over its paired seeds once there are some
            values = np.array([recs[s]["final_return"] for s in seeds])
            cell["arms"][arm] = {
                "seeds": seeds,
                "final_return": values.tolist(),
                "mean": float(values.mean()),
                "min": float(values.min()),
                "max": float(values.max()),
                "timesteps": sorted({int(recs[s]["timesteps_requested"]) for s in seeds}),
                "wall_min_mean": float(np.mean([recs[s]["wall_s"] for s in seeds]) / 60),
                "cpu_min_mean": float(np.mean([recs[s]["cpu_s"] for s in seeds]) / 60),
                "resolved": _activation_summary([recs[s] for s in seeds]),
                "commits": sorted({recs[s]["git"]["commit"] for s in seeds}),
                "dirty_library_files": sorted({f for s in seeds for f in recs[s]["git"]["dirty_library_files"]}),
            }
        sb3_recs, plastic_recs = by_arm.get("sb3", {}), by_arm.get("plastic", {})
        if setting.policy == "CnnPolicy" and sb3_recs and plastic_recs:
            # the SB3 arm copies the plastic default's CNN when it runs: both arms must have built the same one
            def network(rec: dict[str, Any]) -> tuple[Any, ...]:
                res = rec["resolved"]
                return (json.dumps(res["parts"].get("features_extractor")), res.get("features_extractor_class"),
                        res.get("features_extractor_arch"), res.get("features_dim"), json.dumps(res.get("net_arch")))

            nets = {arm: {network(r) for r in recs.values()} for arm, recs in (("sb3", sb3_recs), ("plastic", plastic_recs))}
            cell["same_network"] = nets["sb3"] == nets["plastic"] and len(nets["sb3"]) == 1
        random_path = out_dir / name / "random.json"
        random_mean = float(json.loads(random_path.read_text())["mean"]) if random_path.exists() else None
        cell["random"] = random_mean
        cell["paired_seeds"] = paired
        cell["unpaired_runs"] = sorted(f"{arm}_seed{s}" for arm in ARMS for s in by_arm.get(arm, {}) if s not in paired)
        if paired and random_mean is not None:
            sb3 = np.array([by_arm["sb3"][s]["final_return"] for s in paired])
            plastic = np.array([by_arm["plastic"][s]["final_return"] for s in paired])
            diff = plastic - sb3
            boot_ci = bootstrap_mean_ci(diff)
            t_ci = t_mean_ci(diff)
            # the verdict uses the wider of the two: with 5-10 seeds the percentile bootstrap alone undercovers
            ci = (min(boot_ci[0], t_ci[0]), max(boot_ci[1], t_ci[1]))
            hashes = [(by_arm["sb3"][s].get("initial_params_sha1"), by_arm["plastic"][s].get("initial_params_sha1"))
                      for s in paired]
            known = [a == b for a, b in hashes if a and b]
            cell["same_initial_params"] = f"{sum(known)}/{len(known)} seeds" if known else "not recorded"
            scale = float(sb3.mean()) - random_mean
            margin = MARGIN * scale if scale > 0 else float("nan")
            cell.update(
                diff=diff.tolist(),
                diff_mean=float(diff.mean()),
                diff_ci95=list(boot_ci),
                diff_ci95_t=list(t_ci),
                verdict_ci=list(ci),
                pairing_correlation=(float(np.corrcoef(sb3, plastic)[0, 1])
                                     if len(paired) > 2 and sb3.std() > 0 and plastic.std() > 0 else None),
                margin=margin,
                verdict=(verdict(ci, margin) if np.isfinite(margin) else "not resolved (SB3 at or below random)")
                if len(paired) >= MIN_SEEDS else f"no verdict (< {MIN_SEEDS} paired seeds)",
                plastic_better_seeds=int((diff > 0).sum()),
                plastic_worse_seeds=int((diff < 0).sum()),
                sign=("-" if not np.isfinite(ci[0]) else "plastic lower (CI < 0)" if ci[1] < 0
                      else "plastic higher (CI > 0)" if ci[0] > 0 else "CI spans 0"),
            )
            curves = {arm: [_curve_mean(by_arm[arm][s]) for s in paired] for arm in ARMS}
            if all(c is not None for arm in ARMS for c in curves[arm]):
                c_sb3, c_plastic = np.array(curves["sb3"]), np.array(curves["plastic"])
                c_ci = bootstrap_mean_ci(c_plastic - c_sb3)
                cell["curve_mean"] = {"sb3": float(c_sb3.mean()), "plastic": float(c_plastic.mean()),
                                      "diff_mean": float((c_plastic - c_sb3).mean()), "diff_ci95": list(c_ci)}
            iqm = _iqm_ci({"sb3": sb3[:, None], "plastic": plastic[:, None]})
            cell["iqm"] = {arm: {"point": v[0], "ci95": [v[1], v[2]]} for arm, v in iqm.items()}
            if scale > 0:
                normalised["sb3"].append(dict(zip(paired, (sb3 - random_mean) / scale)))
                normalised["plastic"].append(dict(zip(paired, (plastic - random_mean) / scale)))
        cells[name] = cell
        rows.append(name)
    aggregate = None
    # the aggregate is over the seeds every cell has paired (rliable's score matrices are runs x tasks)
    common = sorted(set.intersection(*(set(d) for d in normalised["sb3"]))) if normalised["sb3"] else []
    if len(normalised["sb3"]) >= 2 and len(common) >= MIN_SEEDS:
        scores = {arm: np.array([[d[seed] for d in normalised[arm]] for seed in common]) for arm in ARMS}
        iqm = _iqm_ci(scores)
        _, poi, _ = _metrics()
        p = stratified_bootstrap(poi, scores["plastic"], scores["sb3"], reps=2000)
        aggregate = {"cells": [r for r in rows if "diff" in cells[r]], "seeds": common,
                     "iqm_normalised": {arm: {"point": v[0], "ci95": [v[1], v[2]]} for arm, v in iqm.items()},
                     "p_plastic_better": {"point": p[0], "ci95": [p[1], p[2]]}}
    if write:
        plot_curves(runs, cells, out_dir / "curves.png")
    summary = {"margin_fraction": MARGIN, "n_boot": N_BOOT, "metrics": _metrics()[2], "cells": cells,
               "aggregate": aggregate}
    table = markdown(summary)
    if write:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        (out_dir / "summary.md").write_text(table + "\n")
    print(table)
    return summary


def _seed_text(seeds: list[int]) -> str:
    contiguous = seeds == list(range(seeds[0], seeds[-1] + 1))
    return f"{seeds[0]}-{seeds[-1]}" if contiguous and len(seeds) > 2 else ", ".join(map(str, seeds))


def _unpaired(cell: dict[str, Any]) -> str:
    n = len(cell.get("unpaired_runs", []))
    return f" (+{n} unpaired)" if n else ""


def plot_curves(runs: dict[str, Any], cells: dict[str, Any], path: Path) -> Optional[Path]:
    """Learning curves of both arms per cell (mean over the paired seeds, min-max band), one panel per cell."""
    names = [n for n in cells if cells[n]["paired_seeds"]]
    if not names:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        for arm, color in (("sb3", "tab:blue"), ("plastic", "tab:orange")):
            curves = [runs[name][arm][s]["curve"] for s in cells[name]["paired_seeds"]]
            n = min(len(c) for c in curves)
            if n == 0:
                continue
            steps = np.array([c[:n] for c in curves])[:, :, 0].mean(axis=0)
            values = np.array([[v for _, v in c[:n]] for c in curves])
            ax.plot(steps, values.mean(axis=0), color=color, label=f"{arm} (n={len(curves)})")
            ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=color, alpha=0.2)
        ax.set_title(f"{name} ({SETTINGS[name].env_id})", fontsize=9)
        ax.set_xlabel("env steps")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("deterministic eval return")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _arm_text(a: Optional[dict[str, Any]]) -> str:
    return "-" if a is None else f"{_fmt(a['mean'])} ({_fmt(a['min'])} .. {_fmt(a['max'])}), n={len(a['seeds'])}"


def _iqm_text(v: Optional[dict[str, Any]]) -> str:
    return "-" if v is None else f"{_fmt(v['point'])} [{_fmt(v['ci95'][0])}, {_fmt(v['ci95'][1])}]"


def markdown(summary: dict[str, Any]) -> str:
    """The tables of the summary."""
    lines = [
        "| setting | steps | seeds | SB3 mean (min .. max) | plastic mean (min .. max) | "
        "plastic - SB3 [bootstrap 95% CI]; t CI | margin | "
        "verdict | IQM SB3 [CI] | IQM plastic [CI] | random | min/run SB3, plastic |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cell in summary["cells"].items():
        arms = cell["arms"]

        iqm = cell.get("iqm", {})
        steps = sorted({t for a in arms.values() for t in a["timesteps"]})
        sb3_text, plastic_text = (_arm_text(arms.get(arm)) for arm in ("sb3", "plastic"))
        iqm_sb3, iqm_plastic = (_iqm_text(iqm.get(arm)) for arm in ("sb3", "plastic"))
        diff = "-"
        if "diff_mean" in cell:
            lo, hi = cell["diff_ci95"]
            tlo, thi = cell["diff_ci95_t"]
            diff = f"{cell['diff_mean']:+.2f} [{lo:+.2f}, {hi:+.2f}]; t [{tlo:+.2f}, {thi:+.2f}]"
        times = ", ".join(_fmt(arms[a]["wall_min_mean"]) if a in arms else "-" for a in ARMS)
        if cell.get("same_network") is False:
            diff += " (networks differ!)"
        lines.append(
            f"| {name} | {'/'.join(f'{s:g}' for s in steps)} | {len(cell['paired_seeds'])} paired{_unpaired(cell)} | "
            f"{sb3_text} | "
            f"{plastic_text} | {diff} | {_fmt(cell.get('margin', float('nan')), 2)} | {cell.get('verdict', '-')} | "
            f"{iqm_sb3} | {iqm_plastic} | {_fmt(cell['random'] if cell['random'] is not None else float('nan'))} "
            f"| {times} |"
        )
    agg = summary.get("aggregate")
    if agg:
        s, p = agg["iqm_normalised"]["sb3"], agg["iqm_normalised"]["plastic"]
        lines += [
            "",
            f"Aggregate over {', '.join(agg['cells'])}, seeds {_seed_text(agg['seeds'])} "
            "(score normalised per cell: random = 0, SB3 mean = 1; "
            "IQM, stratified bootstrap 95 % CI; P(plastic > SB3): rliable's probability of improvement):",
            f"SB3 {s['point']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}], "
            f"plastic {p['point']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]"
            + (f"; P(plastic > SB3) = {agg['p_plastic_better']['point']:.2f} "
               f"[{agg['p_plastic_better']['ci95'][0]:.2f}, {agg['p_plastic_better']['ci95'][1]:.2f}]"
               if "p_plastic_better" in agg else ""),
        ]
    lines += ["", "Direction of the paired difference (final return) and the learning curves (mean of the evaluations "
              "every `eval_every` steps, paired bootstrap 95 % CI of plastic - SB3):", "",
              "| setting | final: direction | correlation of the paired finals | curve mean SB3 | curve mean plastic | "
              "curve plastic - SB3 [95% CI] |",
              "|---|---|---|---|---|---|"]
    for name, cell in summary["cells"].items():
        c = cell.get("curve_mean")
        if c is None and "sign" not in cell:
            continue
        curve = ("- | - | -" if c is None else
                 f"{_fmt(c['sb3'])} | {_fmt(c['plastic'])} | {c['diff_mean']:+.1f} [{c['diff_ci95'][0]:+.1f}, "
                 f"{c['diff_ci95'][1]:+.1f}]")
        corr = cell.get("pairing_correlation")
        lines.append(f"| {name} | {cell.get('sign', '-')} | {'-' if corr is None else f'{corr:.2f}'} | {curve} |")
    lines += ["", "Resolved configuration per arm (from the run files):", ""]
    for name, cell in summary["cells"].items():
        for arm, a in cell["arms"].items():
            dirty = f"; uncommitted library edits: {', '.join(a['dirty_library_files'])}" if a["dirty_library_files"] else ""
            lines.append(f"* {name} / {arm} (commit {', '.join(a['commits'])}{dirty}): {a['resolved']}")
        if "same_initial_params" in cell:
            lines.append(f"* {name}: both arms start from identical parameters (same seed): {cell['same_initial_params']}")
    lines += ["", "Every number of a cell is over its paired seeds (both arms finished) once it has some; unpaired "
              "runs are only counted in the seeds column.",
              "", f"Margin: {MARGIN:.0%} of (SB3 mean - random policy). Verdict from the paired 95 % CI of the mean "
              "difference (the wider envelope of the percentile bootstrap CI and the Student-t CI): 'no harm "
              "resolved' if its low end > -margin, 'harm' if its high end < -margin, else 'not resolved'."]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0-4 (--quick: 0 1)")
    parser.add_argument("--timesteps", action="append", default=[], metavar="SETTING=N",
                        help="override a setting's training budget (recorded in every run file)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--force", action="store_true", help="rerun runs whose JSON exists")
    parser.add_argument("--summarise", "--summarize", action="store_true", help="only rebuild the table from the run files")
    parser.add_argument("--no-summary", action="store_true", help="do not print / write the summary after the runs")
    parser.add_argument("--plastic-kwarg", action="append", default=[], metavar="KEY=VALUE",
                        help="ablation: a keyword for the plastic arm (Python literal value, e.g. isometry_coef=0.01); "
                        "not allowed with the default --out, whose plastic arm is the library defaults")
    parser.add_argument("--backfill-init-hash", action="store_true",
                        help="add the initial-parameter hash to run files written without it (rebuilds, no training)")
    parser.add_argument("--library-commit", metavar="REV",
                        help="import sb3_plastic from this commit (a git archive snapshot) instead of the working tree")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK_SETTING} for {QUICK_OVERRIDES['timesteps']} steps, seeds 0 1")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.timesteps:
        key, _, value = item.partition("=")
        if key not in SETTINGS or not value:
            parser.error(f"--timesteps takes SETTING=N with SETTING in {list(SETTINGS)}, got {item!r}")
        overrides[key] = int(float(value))
    args.timestep_overrides = overrides
    plastic = {}
    for item in args.plastic_kwarg:
        key, _, value = item.partition("=")
        try:
            plastic[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            plastic[key] = value
        if not key.isidentifier():
            parser.error(f"--plastic-kwarg takes KEY=VALUE, got {item!r}")
    if plastic and args.out.resolve() == DEFAULT_OUT.resolve() and not args.summarise:
        parser.error(f"--plastic-kwarg changes the plastic arm: give another --out than {DEFAULT_OUT}")
    args.plastic_overrides = plastic
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    settings = dict(SETTINGS)
    names = list(args.settings)
    seeds = list(args.seeds) if args.seeds is not None else ([0, 1] if args.quick else [0, 1, 2, 3, 4])
    if args.quick:
        names = [QUICK_SETTING]
        settings[QUICK_SETTING] = dataclasses.replace(SETTINGS[QUICK_SETTING], **QUICK_OVERRIDES)
    for key, steps in args.timestep_overrides.items():
        settings[key] = dataclasses.replace(settings[key], timesteps=steps)
    PLASTIC_OVERRIDES.clear()
    PLASTIC_OVERRIDES.update(args.plastic_overrides)
    if args.summarise:
        summarise(args.out, names)
        return 0
    if args.library_commit:
        print(f"sb3_plastic from {use_library_commit(args.library_commit)}", flush=True)
    import torch as th

    th.set_num_threads(1)
    if args.backfill_init_hash:
        for name in names:
            for seed in seeds:
                for arm in args.arms:
                    digest = backfill_init_hash(name, settings[name], arm, seed, args.out)
                    if digest:
                        print(f"{name} {arm} seed {seed}: initial parameters {digest}", flush=True)
        return 0
    for name in names:
        ensure_random(name, settings[name], args.out)
        for seed in seeds:
            for arm in args.arms:
                path = args.out / name / f"{arm}_seed{seed}.json"
                if path.exists() and not args.force:
                    print(f"skip {name} {arm} seed {seed}: {path} exists", flush=True)
                    continue
                record = run_one(name, settings[name], arm, seed, args.out)
                print(f"{name} {arm} seed {seed}: final return {record['final_return']:.1f} "
                      f"({record['timesteps']} steps, {record['wall_s'] / 60:.1f} min wall, "
                      f"{record['cpu_s'] / 60:.1f} min CPU)", flush=True)
    if not args.no_summary:
        summarise(args.out, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
