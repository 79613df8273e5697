"""The runs of bench/continual.py: where a run's files are, the fresh agents of a cell, the claim that keeps a
run to one process, training one run with its checkpoints (resuming an interrupted one), one (method, seed)
cell and one job of the grid."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any, Optional

import numpy as np
import run_checkpoint
from continual_methods import (
    TASK_CHANGE_METHODS,
    MethodParams,
    build_model,
    canonical_method,
    make_env,
    method_name,
    normalise_observations,
)
from continual_recorder import (
    _random_steps_at_switch,
    _recording_monitor,
    _rollout_reset,
    _task_recorder,
    _train_scalar_capture,
    train_scalars_from,
    write_record,
)
from continual_settings import Setting, same_setting

#: wall seconds between two checkpoints of a run in progress (None: none; see bench/run_checkpoint.py)
CHECKPOINT_SECONDS: Optional[float] = run_checkpoint.CHECKPOINT_SECONDS


def run_path(out: str, method: str, seed: int, fresh_task: Optional[int] = None) -> str:
    """Where the JSON of a run is: ``runs/<method>/seed<k>.json``, fresh agents under ``runs/<method>/fresh/``."""
    if fresh_task is None:
        return os.path.join(out, "runs", method, f"seed{seed}.json")
    return os.path.join(out, "runs", method, "fresh", f"seed{seed}_task{fresh_task}.json")


#: fresh agents per seed with ``--fresh sample`` (tasks of the run's last half, :func:`fresh_sample`)
FRESH_SAMPLE = 4
#: the ``--fresh`` choices: every task, a sample of the last half, none
FRESH_CHOICES = ("all", "sample", "none")


def fresh_sample(setting: Setting, seed: int, size: int = FRESH_SAMPLE) -> list[int]:
    """The tasks whose fresh agents ``--fresh sample`` trains for run seed ``seed``: ``size`` distinct tasks of the
    last half (``tasks // 2`` to ``tasks - 1``), drawn without replacement by a generator seeded with ``seed`` alone
    (so every method of a seed is compared on the same tasks), sorted; the whole last half when it is smaller.

    For a setting whose tasks are alike in distribution (channel permutations of one game) the fresh agents on a
    sample of the late tasks estimate the same fresh level as agents on every task, for a fraction of the CPU
    (issue #28); the summary's plasticity is then the ratio of aggregates over the sampled cells
    (:func:`ratio_of_means_ci`)."""
    late = list(range(setting.tasks // 2, setting.tasks))
    if size >= len(late):
        return late
    rng = np.random.default_rng([seed, 28])
    return sorted(int(k) for k in rng.choice(late, size=size, replace=False))


def run_parts(setting: Setting, fresh: str, seed: Optional[int] = None) -> list[Optional[int]]:
    """The runs of one (method, seed) cell: ``None`` (the continual run) and the fresh agents: of every task
    (``fresh="all"``), of :func:`fresh_sample`'s tasks of ``seed`` (``"sample"``) or none (``"none"``)."""
    if fresh not in FRESH_CHOICES:
        raise ValueError(f"fresh must be one of {', '.join(map(repr, FRESH_CHOICES))}, got {fresh!r}")
    if fresh == "sample":
        if seed is None:
            raise ValueError("fresh='sample' needs the run's seed (the sample depends on it)")
        return [None, *fresh_sample(setting, seed)]
    return [None] + (list(range(setting.tasks)) if fresh == "all" else [])


def _reuse_plain_fresh(method: str, seed: int, setting: Setting, out: str, fresh_task: Optional[int]) -> Optional[dict]:
    """The fresh agent of a :data:`TASK_CHANGE_METHODS` method is the plain agent (its intervention cannot trigger
    within one task; :func:`build_model` builds the same model with the same seed), so an existing plain fresh run of
    the same seed, task and setting is copied instead of trained again (``reused_from`` names it); else ``None``."""
    if fresh_task is None or canonical_method(method) not in TASK_CHANGE_METHODS:
        return None
    plain = method_name("ppo", setting.algo)
    source = run_path(out, plain, seed, fresh_task)
    if not os.path.exists(source):
        return None
    with open(source) as f:
        record = json.load(f)
    if not same_setting(record["setting"], setting):
        return None
    record.update(method=method, reused_from=plain)
    path = run_path(out, method, seed, fresh_task)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_record(path, record)
    return record


class RunClaimedError(RuntimeError):
    """Another live process on this machine is training the same run (its claim file names it)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def process_identity(pid: int) -> Optional[str]:
    """``"<boot id>:<start time>"`` of a live process (Linux's ``/proc``), or ``None`` where it cannot be read. A pid
    alone does not name a process: a machine that restarts (a new session) reuses pids, so an earlier session's claim
    may name a live, unrelated process; the boot and the start time (clock ticks after boot) tell them apart."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after its last ')' start at field 3
    return f"{boot}:{stat[stat.rindex(')') + 2:].split()[19]}"


def _claim_holder_alive(pid: int, identity: Optional[str]) -> bool:
    """Whether the process a claim names (pid, and its identity where the claim recorded one) is still running."""
    if not _pid_alive(pid):
        return False
    if identity is None:  # a claim from before identities were recorded, or from a machine without /proc
        return True
    now = process_identity(pid)
    return now is None or now == identity


def claim_run(path: str, take_over: bool = False) -> str:
    """Claim the run whose JSON is ``path`` for this process: ``<path>.claim`` made with ``O_EXCL`` holds
    ``host pid identity`` (:func:`process_identity`; ``host pid`` where it cannot be read). Two processes training
    one run would share (and the later one delete) its TensorBoard folder and race on its JSON, so a claim held by a
    live process on this host raises :class:`RunClaimedError`; a claim left by a dead process (an interrupted
    attempt, or an earlier boot's process whose pid a new one reuses) is taken over; one from another host is
    respected (remove it by hand when that host is gone) unless ``take_over`` (bench/grid.py's retry of a trial whose
    worker optuna's heartbeat declared dead). Returns the claim's path (remove it when the run is written)."""
    import socket

    claim = path + ".claim"
    identity = process_identity(os.getpid())
    me = f"{socket.gethostname()} {os.getpid()}" + (f" {identity}" if identity else "")
    os.makedirs(os.path.dirname(claim) or ".", exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                with open(claim) as f:
                    host, pid, *held_identity = f.read().split()
            except (OSError, ValueError):  # being written this instant, or unreadable: treat as held
                raise RunClaimedError(f"{path} is claimed ({claim} exists)") from None
            alive = _claim_holder_alive(int(pid), held_identity[0] if held_identity else None)
            if not take_over and (host != socket.gethostname() or alive):
                raise RunClaimedError(f"{path} is being trained by pid {pid} on {host} ({claim})") from None
            os.remove(claim)  # a dead process's claim (or one handed over)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(me)
        return claim
    raise RunClaimedError(f"{path}: could not claim {claim}")


def run_one(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str, threads: int,
            fresh_task: Optional[int] = None, take_over: bool = False) -> dict:
    """Train one run (the continual run, or with ``fresh_task`` the fresh agent of that task) and write its JSON
    (:func:`run_path`); returns its record. The run is claimed first (:func:`claim_run`): a run that another live
    process is training raises :class:`RunClaimedError` and nothing of it is touched."""
    reused = _reuse_plain_fresh(method, seed, setting, out, fresh_task)
    if reused is not None:
        return reused
    path = run_path(out, method, seed, fresh_task)
    if run_checkpoint.stop_requested():  # this process was asked to stop: start nothing new
        raise run_checkpoint.RunStopped("not started: this process was asked to stop")
    claim = claim_run(path, take_over)
    try:
        if os.path.exists(path):  # finished by the previous claimant between our check and our claim
            with open(path) as f:
                return json.load(f)
        with _no_distribution_checks():
            return _train_run(method, seed, setting, params, out, device, threads, fresh_task)
    finally:
        os.remove(claim)


@contextlib.contextmanager
def _no_distribution_checks() -> Iterator[None]:
    """torch.distributions' argument checks off (restored after): SB3 builds a Categorical / Normal at every policy
    call, and the checks of their parameters cost a few % of a run's CPU time (paired pieces: bench/README.md, "Cost per
    run") while changing no number (a test compares records with and without)."""
    import torch as th

    previous = th.distributions.Distribution._validate_args
    th.distributions.Distribution.set_default_validate_args(False)
    try:
        yield
    finally:
        th.distributions.Distribution.set_default_validate_args(previous)


#: the task recorder's internals a checkpoint keeps (the rest of its state is the ``results`` dict)
_RECORDER_FIELDS = ("_task", "_sums", "_counts", "_returns", "_recent", "_iteration_means", "_task_step",
                    "_switch")


#: what a checkpoint keeps of the evaluation callback besides its env (SB3's EvalCallback counts calls for its
#: schedule; ContinualEvalCallback's per-evaluation lists)
_EVALUATOR_FIELDS = ("n_calls", "evaluation_num_timesteps", "evaluation_task_ids", "evaluation_mean_rewards",
                     "evaluations_timesteps", "evaluations_results", "evaluations_length", "best_mean_reward",
                     "last_mean_reward", "last_task")


def _evaluator(setting: Setting, seed: int, fresh_task: Optional[int], method: str = "ppo") -> Any:
    """The greedy evaluations of a setting with ``eval_every`` (else ``None``): a
    :class:`~sb3_plastic.callbacks.ContinualEvalCallback` on a second env of the run's task sequence (env seed
    ``1234 * seed + 1``: C-CHAIN's ``1234 * seed``, plus 1 so that seed 0's evaluation env is not seeded as its
    training env is), ``eval_episodes`` deterministic episodes every ``eval_every`` timesteps. For
    ``ppo_vecnorm`` the evaluation env is normalised too, with the training env's statistics (SB3's ``EvalCallback``
    copies them before each evaluation; they are not updated by the evaluation)."""
    if not setting.eval_every:
        return None
    from sb3_plastic.callbacks import ContinualEvalCallback

    env = make_env(setting, seed, fresh_task, env_seed=1234 * seed + 1)
    if canonical_method(method) == "ppo_vecnorm":
        env = normalise_observations(env, training=False)
    return ContinualEvalCallback(env, eval_freq=max(setting.eval_every // setting.n_envs, 1),
                                 n_eval_episodes=setting.eval_episodes, deterministic=True, verbose=0,
                                 eval_at_task_start=setting.eval_at_task_start)


def _with_evaluator_state(extra: Any, evaluator: Any) -> Any:
    def with_state() -> dict[str, Any]:
        state = {k: getattr(evaluator, k) for k in _EVALUATOR_FIELDS}
        return dict(extra(), evaluator=state, evaluator_env=run_checkpoint.dumps_env(evaluator.eval_env))

    return with_state


def _with_evaluator_restore(restore: Any, evaluator: Any, saved: dict[str, Any]) -> Any:
    def with_restore() -> None:
        restore()
        for key, value in saved["evaluator"].items():
            setattr(evaluator, key, value)
        evaluator.eval_env.close()
        evaluator.eval_env = run_checkpoint.loads_env(saved["evaluator_env"])

    return with_restore


def _logged(logger: Any) -> dict[str, dict[str, Any]]:
    """What SB3's logger holds and has not written yet. A checkpoint falls at a rollout start, between the ``train()``
    call that recorded its scalars and the dump after the rollout: the resumed run writes them as the whole one does,
    and a callback that reads them at the rollout start (C-CHAIN's adaptation of its coefficient) finds them."""
    return {"name_to_value": dict(logger.name_to_value), "name_to_count": dict(logger.name_to_count),
            "name_to_excluded": dict(logger.name_to_excluded)}


def _log_again(logger: Any, logged: Optional[dict[str, dict[str, Any]]]) -> None:
    """Put the values :func:`_logged` took back into the resumed run's logger (checkpoints from before it: nothing)."""
    for field, values in (logged or {}).items():
        getattr(logger, field).update(values)


def _purge_events_after(tb_root: str, name: str, step: int) -> None:
    """Hide from TensorBoard what an interrupted attempt of the run ``name`` wrote after its checkpoint at ``step``:
    a ``SessionLog.START`` event at ``step + 1`` in the run's events folder (torch's ``SummaryWriter(purge_step=...)``),
    after which TensorBoard (and tensorboard's ``EventAccumulator``) drops the earlier events of later steps, so that
    the resumed run's curve replaces them instead of doubling them.

    TensorBoard reads a folder's event files in the order of their names, ``events.out.tfevents.<seconds>.<host>.<pid>.
    <counter>`` (a string order, in which counter 10 comes before 9): the purge file is named to come after every file
    there (a later second than theirs: it waits for the next second when one was written in this one) and before the
    file SB3's writer of the resumed run opens next (``!`` sorts before a host name)."""
    from stable_baselines3.common.utils import get_latest_run_id
    from torch.utils.tensorboard import SummaryWriter

    run_id = get_latest_run_id(tb_root, name)
    if run_id == 0:  # no folder yet: nothing to hide
        return
    folder = os.path.join(tb_root, f"{name}_{run_id}")
    seconds = [int(f.split(".")[3]) for f in os.listdir(folder) if f.startswith("events.out.tfevents.")
               and len(f.split(".")) > 3 and f.split(".")[3].isdigit()]
    while seconds and int(time.time()) <= max(seconds):
        time.sleep(0.05)
    scratch = os.path.join(folder, ".purge")
    writer = SummaryWriter(scratch, purge_step=step + 1)
    writer.close()
    (written,) = os.listdir(scratch)
    stamp = written.split(".")[3]
    os.replace(os.path.join(scratch, written), os.path.join(folder, f"events.out.tfevents.{stamp}.!purge.{step + 1}"))
    os.rmdir(scratch)


def checkpoint_root(out: str, method: str, seed: int, fresh_task: Optional[int] = None) -> str:
    """Where the checkpoints of a run in progress are (``ckpt/<method>/s<k>[_task<j>]``; not committed, removed
    when the run is written)."""
    return os.path.join(out, "ckpt", method, f"s{seed}" if fresh_task is None else f"s{seed}_task{fresh_task}")


def _train_run(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str, threads: int,
               fresh_task: Optional[int]) -> dict:
    """Train one run; resume it from its latest checkpoint (:mod:`run_checkpoint`) when an interrupted attempt
    left one, else start it afresh (an interrupted attempt's TensorBoard folder removed first)."""
    import torch as th

    th.set_num_threads(threads)
    tb_root = os.path.join(out, "tb", method) if fresh_task is None else os.path.join(out, "tb", method, "fresh")
    name = f"s{seed}" if fresh_task is None else f"s{seed}_task{fresh_task}"
    ckpt_root = checkpoint_root(out, method, seed, fresh_task)
    resume = run_checkpoint.latest(ckpt_root)
    if resume is None:
        shutil.rmtree(ckpt_root, ignore_errors=True)
        for stale in (d for d in (os.listdir(tb_root) if os.path.isdir(tb_root) else []) if d.startswith(f"{name}_")):
            shutil.rmtree(os.path.join(tb_root, stale))  # an interrupted attempt
    start = time.time()
    cpu_start = time.process_time()
    model, callbacks = build_model(method, setting, params, seed, device, tb_root, fresh_task=fresh_task)
    saved: dict[str, Any] = {}
    if resume is not None:
        built = model
        model, saved = run_checkpoint.load(resume, type(built), device, tb_root)
        built.get_env().close()
    results: dict[str, list[float]] = saved.get("results") or {
        "task": [], "mean_reward": [], "end_reward": [], "end_return": [], "end_episodes": []}
    monitor = _recording_monitor(setting.monitor_every)
    monitor.history = saved.get("monitor_history", monitor.history)
    capture = _train_scalar_capture()
    if resume:  # a checkpoint written before the capture existed has none: its record falls back to the events
        capture.complete = "train_scalars_logged" in saved
        for tag, values in saved.get("train_scalars_logged", {}).items():
            capture.logged.setdefault(tag, {}).update(values)
    path = run_path(out, method, seed, fresh_task)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    recorder = _task_recorder(setting, results, path.replace(".json", ".progress"))
    resumes = [*saved.get("resumes", []), int(model.num_timesteps)] if resume else []
    if resume and model.tensorboard_log:
        _purge_events_after(model.tensorboard_log, name, int(model.num_timesteps))
    before_cpu, before_wall = saved.get("cpu_seconds", 0.0), saved.get("wall_seconds", 0.0)

    def extra() -> dict[str, Any]:
        return {"results": results, "recorder": {k: getattr(recorder, k) for k in _RECORDER_FIELDS},
                "monitor_history": monitor.history, "monitor_probe": monitor._probe, "resumes": resumes,
                "train_scalars_logged": capture.logged,
                "logger": _logged(model.logger),
                "cpu_seconds": before_cpu + time.process_time() - cpu_start,
                "wall_seconds": before_wall + time.time() - start}

    def restore() -> None:
        run_checkpoint.restore_rng(saved, model)
        for key, value in saved["recorder"].items():
            setattr(recorder, key, value)
        monitor._probe = saved["monitor_probe"]  # the model's state carries it too since the twenty-ninth session;
        # checkpoints written before that have it only here
        _log_again(model.logger, saved.get("logger"))

    evaluator = _evaluator(setting, seed, fresh_task, method)
    if evaluator is not None:
        extra = _with_evaluator_state(extra, evaluator)
        restore = _with_evaluator_restore(restore, evaluator, saved)
    checkpointer = run_checkpoint.checkpointer(ckpt_root, CHECKPOINT_SECONDS, extra, restore if resume else None)
    steps = setting.total_timesteps if fresh_task is None else setting.task_timesteps
    evaluating = [] if evaluator is None else [evaluator]
    resetting = [_rollout_reset()] if setting.rollout_reset else []
    if setting.advantage_norm == "rollout":
        import dohare_ppo

        resetting.append(dohare_ppo.rollout_advantage_norm())
    if setting.random_steps_per_task and fresh_task is None:
        resetting.append(_random_steps_at_switch(setting.random_steps_per_task))
    model.learn(steps - model.num_timesteps if resume else steps,
                callback=[checkpointer, *resetting, *callbacks, monitor, recorder, capture, *evaluating],
                tb_log_name=name, reset_num_timesteps=resume is None)
    record = {
        "method": method,
        "seed": seed,
        "task_seed": seed,
        "fresh_task": fresh_task,
        "setting": asdict(setting),
        "params": asdict(params),
        "device": str(model.device),
        "torch": th.__version__,  # the build that trained it (a run spread to another machine says so)
        "timesteps": int(model.num_timesteps),
        "wall_seconds": before_wall + time.time() - start,
        "cpu_seconds": before_cpu + time.process_time() - cpu_start,
        **results,
        "diagnostics": monitor.history,
    }
    if capture.complete:  # else add_train_scalars copies them from the TensorBoard events, where they are
        record["train_scalars"] = train_scalars_from(capture.logged, setting,
                                                     setting.tasks if fresh_task is None else 1)
    if evaluator is not None:
        record["evaluations"] = [[int(t), int(k), float(r)] for t, k, r in zip(
            evaluator.evaluation_num_timesteps, evaluator.evaluation_task_ids, evaluator.evaluation_mean_rewards)]
    if resumes:
        record["resumed_at"] = resumes  # num_timesteps of each resume from a checkpoint (an interrupted session)
    write_record(path, record)
    progress = path.replace(".json", ".progress")
    if os.path.exists(progress):
        os.remove(progress)
    shutil.rmtree(ckpt_root, ignore_errors=True)
    return record


def run_cell(method: str, seed: int, setting: Setting, params: MethodParams, out: str, device: str = "cpu",
             threads: int = 1, fresh: str = "all", take_over: bool = False) -> dict:
    """Every run of one (method, seed) cell that has no JSON yet (the continual run, then the fresh agents), one
    after the other; returns the continual record (bench/grid.py's unit of work). ``take_over``: see
    :func:`claim_run`."""
    for part in run_parts(setting, fresh, seed):
        if not os.path.exists(run_path(out, method, seed, part)):
            run_one(method, seed, setting, params, out, device, threads, part, take_over)
    with open(run_path(out, method, seed)) as f:
        return json.load(f)


def _run_job(job: tuple) -> tuple[str, int, Optional[int], float, Optional[str]]:
    method, seed, fresh_task, setting, params, out, device, threads = job
    run_checkpoint.install_stop_handler()  # a pool worker (spawned) stops on the signal as the main process does
    start = time.time()
    try:
        run_one(method, seed, setting, params, out, device, threads, fresh_task)
        return method, seed, fresh_task, time.time() - start, None
    except Exception as exc:  # reported, the grid goes on
        return method, seed, fresh_task, time.time() - start, f"{type(exc).__name__}: {exc}"
