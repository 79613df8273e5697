"""What bench/continual.py records of a run: the per-task recorder (:func:`_task_recorder`), the output head's
statistics, the plasticity monitor that keeps its diagnostics, the rollout reset, the run JSON
(:func:`write_record`), and what is read back from a run's TensorBoard events (SB3's training scalars,
the hidden-layer DfI)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

import numpy as np
from continual_settings import Setting


def _task_recorder(setting: Setting, results: dict[str, list[float]], progress_path: Optional[str] = None) -> Any:
    """A callback accumulating, per task of env copy 0's ``info["task_id"]``, the mean reward per env step
    over the task and over its last ``tail`` part, and the mean return of the episodes ending in that tail;
    writes ``continual/...`` keys to SB3's logger at each task end.

    A task's reading covers its first ``change_every`` env steps (``info["task_step"]`` 1 to ``change_every``) and
    nothing after: SB3 stops ``learn`` at the first rollout boundary at or after ``total_timesteps``, so a fresh
    agent (its env pinned to one task) runs a few steps past the task's length when ``change_every`` is not a
    multiple of ``n_steps``. The continual run's steps there belong to the next task; read by the fresh agent, an
    episode ending in them would make the fresh reading of the same training differ from the continual one.

    With ``setting.rollout_reset`` it also records ``iteration_return`` per task: TRAC / C-CHAIN's per-iteration score
    (their ``itr_mean_return``), the mean over the rollouts that end in the task's tail of each rollout's mean episode
    return, where the episodes are those ending in the rollout plus the one its end cuts (with the partial return it
    reached; the next rollout starts new episodes).

    The head's statistics (:func:`head_statistics`) are read twice per task: over the last :data:`HEAD_PROBE_STEPS`
    steps of its tail (``head_*``) and as the task finds the network, ``switch_head_*``: the mean over the task's
    first :data:`HEAD_PROBE_STEPS` steps, each step's observations read with the network of that step (a PPO task
    that starts at a rollout's start is read before any update on it). Task 0's reading is the initial network's; a
    later task's tells a head saturated by the switch (the old head on the new observations) from one that
    saturates while it trains."""
    from stable_baselines3.common.callbacks import BaseCallback

    tail_start = round((1.0 - setting.tail) * setting.change_every)

    class TaskRecorder(BaseCallback):
        def _on_training_start(self) -> None:
            self._task: Optional[int] = None
            self._sums = np.zeros(2)
            self._counts = np.zeros(2)
            self._returns: list[float] = []
            self._recent: list[np.ndarray] = []  # the last HEAD_PROBE_STEPS steps' observations of the task's tail
            self._switch: dict[str, list[float]] = {}  # head statistics of the task's first HEAD_PROBE_STEPS steps
            self._rollout_returns: list[float] = []  # returns of the episodes ended in the rollout in progress
            self._iteration_means: list[float] = []  # the task's rollouts' mean returns (rollout_reset)
            self._task_step = 0

        def _on_rollout_start(self) -> None:
            self._rollout_returns = []

        def _on_rollout_end(self) -> None:
            if not setting.rollout_reset or self._task_step <= tail_start or self._task_step > setting.change_every:
                return
            # the episode in progress is cut here (the next rollout resets the envs): its partial return counts
            partial = [float(np.sum(r)) for r in self.training_env.get_attr("rewards") if len(r)]
            returns = self._rollout_returns + partial
            if returns:
                self._iteration_means.append(float(np.mean(returns)))

        def _close_task(self) -> None:
            if self._task is None or self._counts[0] == 0 or self._task >= setting.tasks:
                return  # (the last rollout may run a few steps into a task past the schedule)
            mean = float(self._sums[0] / self._counts[0])
            end = float(self._sums[1] / self._counts[1]) if self._counts[1] else float("nan")
            end_return = float(np.mean(self._returns)) if self._returns else float("nan")
            results["task"].append(self._task)
            results["mean_reward"].append(mean)
            results["end_reward"].append(end)
            results["end_return"].append(end_return)
            results["end_episodes"].append(len(self._returns))
            if setting.rollout_reset:
                means = self._iteration_means
                results.setdefault("iteration_return", []).append(float(np.mean(means)) if means else float("nan"))
            for key, value in head_statistics(self.model, self._recent).items():
                results.setdefault(key, []).append(value)
            for key, values in self._switch.items():
                _append_per_task(results, "switch_" + key, float(np.mean(values)))
            self.logger.record("continual/end_of_task_reward", end)
            self.logger.record("continual/end_of_task_return", end_return)
            self.logger.record("continual/task_mean_reward", mean)
            self.logger.record("continual/task", self._task)
            if progress_path:  # what an interrupted run had reached (never read as a finished run)
                with open(progress_path, "w") as f:
                    json.dump(results, f)

        def _on_step(self) -> bool:
            infos = self.locals["infos"]
            task = int(infos[0].get("task_id", 0))
            if task != self._task:
                self._close_task()
                self._task, self._sums[:], self._counts[:], self._returns = task, 0.0, 0.0, []
                self._recent, self._iteration_means, self._switch = [], [], {}
            task_step = self._task_step = int(infos[0].get("task_step", 0))
            if task_step > setting.change_every:
                return True  # past the task's length: a fresh agent's last rollout (see above)
            obs = self.locals.get("new_obs")
            if HEAD_PROBE_STEPS and task_step <= HEAD_PROBE_STEPS and isinstance(obs, np.ndarray):
                # the head as the task finds it: each of its first steps read with the network of that step
                for key, value in head_statistics(self.model, [obs]).items():
                    self._switch.setdefault(key, []).append(value)
            self._rollout_returns.extend(float(i["episode"]["r"]) for i in infos if "episode" in i)
            rewards = np.asarray(self.locals["rewards"], dtype=np.float64)
            self._sums[0] += rewards.sum()
            self._counts[0] += rewards.size
            if task_step > tail_start:
                self._sums[1] += rewards.sum()
                self._counts[1] += rewards.size
                self._returns.extend(float(i["episode"]["r"]) for i in infos if "episode" in i)
                if HEAD_PROBE_STEPS and isinstance(obs, np.ndarray):
                    self._recent.append(obs.copy())
                    del self._recent[:-HEAD_PROBE_STEPS]
            return True

        def _on_training_end(self) -> None:
            self._close_task()

    return TaskRecorder()


#: env steps (of every copy) whose observations probe the output head at a task's end and at its start
#: (:func:`head_statistics`; 0: no probe)
HEAD_PROBE_STEPS = 32


def _append_per_task(results: dict[str, list[float]], key: str, value: float) -> None:
    """Append the reading of the task just closed (the last entry of ``results["task"]``) to ``results[key]``,
    first padding with NaN the tasks that have none (a run resumed from a checkpoint written before the key
    existed, or a task resumed past its start), so that the list stays aligned with ``results["task"]``."""
    values = results.setdefault(key, [])
    values.extend([float("nan")] * (len(results["task"]) - 1 - len(values)))
    values.append(value)


def head_statistics(model: Any, observations: list[np.ndarray]) -> dict[str, float]:
    """What the output head does on ``observations`` (the last observations of a task's tail, or its first ones),
    so a collapse can be read per task: for a policy with a categorical distribution (PPO), ``head_entropy`` (mean entropy of
    pi(.|s)), ``head_max_prob`` (mean probability of the most likely action) and ``head_logit_std`` (mean over
    states of the standard deviation of the logits across actions: the logit scale); for a Q-network (DQN),
    ``head_q_std`` (the same spread of Q(s, .)) and ``head_q_max`` (mean max_a Q(s, a)); for a diagonal Gaussian
    policy (PPO on MuJoCo), ``head_action_std`` (mean over states and action dimensions of the policy's standard
    deviation) and ``head_mean_abs`` (the same of |mean action|: a mean driven far outside the action bounds is the
    Gaussian head's saturation, the clipped action no longer moving with it). Forward passes only, in the policy's
    current mode, no random numbers drawn (training is unchanged). ``{}`` without observations or for other heads
    (SAC's squashed actor)."""
    import torch as th

    if not observations:
        return {}
    policy = model.policy
    obs = np.concatenate(observations)
    with th.no_grad():
        tensor = policy.obs_to_tensor(obs)[0]
        if hasattr(policy, "q_net"):
            q = policy.q_net(tensor).double()
            return {"head_q_std": float(q.std(dim=1).mean()), "head_q_max": float(q.max(dim=1).values.mean())}
        if not hasattr(policy, "get_distribution"):
            return {}
        dist = policy.get_distribution(tensor).distribution
        if isinstance(dist, th.distributions.Normal):
            return {"head_action_std": float(dist.stddev.double().mean()),
                    "head_mean_abs": float(dist.mean.double().abs().mean())}
        logits = getattr(dist, "logits", None)
        if logits is None:
            return {}
        logits = logits.double()
        probs = th.softmax(logits, dim=1)
        entropy = -(probs * th.log_softmax(logits, dim=1)).sum(dim=1)
        return {"head_entropy": float(entropy.mean()), "head_max_prob": float(probs.max(dim=1).values.mean()),
                "head_logit_std": float(logits.std(dim=1).mean())}


def _rollout_reset() -> Any:
    """The callback of a setting with ``rollout_reset``: every env copy is reset at each rollout start, so a rollout
    starts new episodes as TRAC's and C-CHAIN's PPO iterations do (their ``env.reset()`` at every iteration; the
    episode an iteration's end cuts is bootstrapped with the value of its last observation, as SB3's PPO does at a
    rollout's end). Put it first after the checkpointer."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutReset(BaseCallback):
        def _on_rollout_start(self) -> None:
            self.model._last_obs = self.training_env.reset()
            self.model._last_episode_starts = np.ones((self.training_env.num_envs,), dtype=bool)

        def _on_step(self) -> bool:
            return True

    return RolloutReset()


def _random_steps_at_switch(steps: int) -> Any:
    """The callback of a DQN setting with ``random_steps_per_task``: when the task id of the first env copy changes
    (not at the run's start, nor at a resume), SB3's ``learning_starts`` moves to ``num_timesteps + steps``, so the
    next ``steps`` actions are uniformly random and no update is made (SB3's warm-up; C-CHAIN's runs start every game
    so). ``learning_starts`` is saved with the model: a run resumed inside the window keeps it."""
    from stable_baselines3.common.callbacks import BaseCallback

    class RandomStepsAtSwitch(BaseCallback):
        def _on_training_start(self) -> None:
            self.task: Any = None

        def _on_step(self) -> bool:
            task = self.locals["infos"][0].get("task_id")
            if self.task is not None and task != self.task:
                self.model.learning_starts = int(self.model.num_timesteps) + steps
            self.task = task
            return True

    return RandomStepsAtSwitch()


def _train_scalar_capture() -> Any:
    """The callback that keeps, in ``logged`` (``{tag: {num_timesteps: value}}``), the values of
    :data:`TRAIN_SCALARS` that SB3's logger writes out at each of its dumps, at the step the TensorBoard events get:
    a KVWriter of SB3's (``stable_baselines3.common.logger``) added to the model's logger at each training start. The
    run JSON's ``train_scalars`` come from it (:func:`train_scalars_from`), so they no longer depend on the
    TensorBoard events, which are not committed and so are lost when a run resumes in another checkout (thirty-third
    session: minatar_intensive CBP seed 2 lost its entropy so). ``logged`` is saved in the run's checkpoint;
    ``complete`` is False when the run resumed from a checkpoint that lacked it (one written before the capture)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import KVWriter

    class Capture(KVWriter):
        def __init__(self, logged: dict[str, dict[int, float]]) -> None:
            self.logged = logged

        def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
            for tag in TRAIN_SCALARS:
                if tag in key_values:
                    self.logged[tag][int(step)] = float(key_values[tag])

        def close(self) -> None:
            pass

    class TrainScalarCapture(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.logged: dict[str, dict[int, float]] = {tag: {} for tag in TRAIN_SCALARS}
            self.complete = True

        def _on_training_start(self) -> None:
            self.model.logger.output_formats.append(Capture(self.logged))

        def _on_step(self) -> bool:
            return True

    return TrainScalarCapture()


def _recording_monitor(every: int) -> Any:
    """A :class:`~sb3_plastic.callbacks.PlasticityMonitor` that also keeps every pass's network-level diagnostics
    (``plasticity/<network>/<metric>``, no per-layer keys) in ``history``: ``{key: [[num_timesteps, value], ...]}``,
    so that the per-run JSON carries them and the diagnostics figure rebuilds without the TensorBoard files."""
    from sb3_plastic import PlasticityMonitor

    class RecordingMonitor(PlasticityMonitor):
        def run(self) -> dict[str, float]:
            values = super().run()
            for key, value in values.items():
                parts = key.split("/")
                if len(parts) == 3 and parts[2] in DIAGNOSTICS and np.isfinite(value):
                    self.history.setdefault(key, []).append([int(self.num_timesteps), float(value)])
            return values

    monitor = RecordingMonitor(every=every, max_overhead=None)
    monitor.history = {}
    return monitor


#: the network-level diagnostics kept in the per-run JSON and plotted (the isometry paper's claim is about the NTK; the
#: DfI's two sides of the hidden layers since the fortieth session: runs before lack them)
DIAGNOSTICS = ("dormant_fraction", "ntk_cond", "ntk_erank", "dfi", "dfi_hidden", "dfi_floor_hidden", "dfi_ceiling_hidden",
               "weight_norm")
#: SB3's own training scalars kept in a run's JSON (:func:`_train_scalar_capture`; before the thirty-third session copied
#: from its TensorBoard events, :func:`add_train_scalars`), per
#: task over the task's tail: PPO's policy entropy (``-train/entropy_loss``) tells a policy that collapsed to one
#: action (entropy 0) from one that still explores
TRAIN_SCALARS = ("train/entropy_loss",)


def write_record(path: str, record: dict) -> None:
    """Write a run's JSON atomically (a temporary file, then a rename): a JSON that exists is a finished run."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _last_per_step(scalars: Any) -> dict[int, float]:
    # in the order the events were written: a resumed run's values replace those its interrupted attempt wrote past
    # the checkpoint it resumed from (they stay in the folder's earlier events file)
    return {int(e.step): float(e.value) for e in scalars}


def scalar_steps(events_dir: str, tag: str) -> dict[int, float]:
    """``{step: value}`` of the scalar ``tag`` in the TensorBoard events of ``events_dir`` (tensorboard's
    ``EventAccumulator``), the last value written at each step; ``{}`` without the tag."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    events.Reload()
    return _last_per_step(events.Scalars(tag)) if tag in events.Tags()["scalars"] else {}


def train_scalars_per_task(events_dir: str, setting: Setting, tasks: int) -> dict[str, list[Optional[float]]]:
    """:func:`train_scalars_from` the TensorBoard events of ``events_dir`` (:func:`scalar_steps`)."""
    return train_scalars_from({tag: scalar_steps(events_dir, tag) for tag in TRAIN_SCALARS}, setting, tasks)


def train_scalars_from(logged: dict[str, dict[int, float]], setting: Setting,
                       tasks: int) -> dict[str, list[Optional[float]]]:
    """Per tag of :data:`TRAIN_SCALARS` with values in ``logged`` (``{tag: {step: value}}``, from the run's capture
    or its TensorBoard events): the mean of the values logged in the tail of each of the first ``tasks`` tasks (the
    last ``setting.tail`` part of ``[k, k + 1) * task_timesteps`` in timesteps); ``None`` for a task without a
    value; a tag never logged (DQN has no entropy) is left out."""
    length = setting.task_timesteps
    out: dict[str, list[Optional[float]]] = {}
    for tag in TRAIN_SCALARS:
        values_at = logged.get(tag) or {}
        if not values_at:
            continue
        steps = np.array(list(values_at), dtype=float)
        values = np.array(list(values_at.values()), dtype=float)
        per_task: list[Optional[float]] = []
        for k in range(tasks):
            start, end = (k + 1.0 - setting.tail) * length, (k + 1.0) * length
            chosen = values[(steps > start) & (steps <= end)]
            per_task.append(float(chosen.mean()) if chosen.size else None)
        out[tag] = per_task
    return out


def _events_dir(out: str, record: dict) -> Path:
    """The TensorBoard events folder of a run JSON under ``out/tb`` (a copied fresh agent's: its source's)."""
    method, seed, fresh_task = record.get("reused_from", record["method"]), record["seed"], record.get("fresh_task")
    if fresh_task is None:
        return Path(out, "tb", method, f"s{seed}_1")
    return Path(out, "tb", method, "fresh", f"s{seed}_task{fresh_task}_1")


def _run_jsons(out: str) -> list[Path]:
    return sorted(Path(out, "runs").glob("*/seed*.json")) + sorted(Path(out, "runs").glob("*/fresh/*.json"))


def hidden_dfi_from_events(events_dir: str, network: str = "policy") -> tuple[dict[int, float], dict[int, float]]:
    """``({step: dfi_hidden}, {step: dfi})`` from a run's TensorBoard events: ``dfi_hidden`` rebuilt from the
    per-layer keys, the sum of ``plasticity/<network>/<layer>/dfi`` over every layer but the heads, at each step
    where every such layer has a value; ``dfi`` the network-level key as logged, which identifies the run. A head is
    a weight layer (it has ``<layer>/sigma_max``, which LSTM matrices do not) without a ``<layer>/dormant_fraction``
    (the monitor scores the units of every non-head layer). The diagnostics' own ``dfi_hidden`` key is the same sum
    (:func:`sb3_plastic.diagnostics.network_diagnostics`); this rebuilds it for runs made before that key existed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(events_dir, size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    prefix = f"plasticity/{network}/"

    def layers_with(metric: str) -> set[str]:
        return {t[len(prefix):-len(metric) - 1] for t in tags
                if t.startswith(prefix) and t.endswith("/" + metric) and t.count("/") == 3}

    heads = layers_with("sigma_max") - layers_with("dormant_fraction")
    per_layer = [_last_per_step(events.Scalars(f"{prefix}{layer}/dfi")) for layer in sorted(layers_with("dfi") - heads)]
    total_tag = f"{prefix}dfi"
    totals = _last_per_step(events.Scalars(total_tag)) if total_tag in tags else {}
    if not per_layer:
        return {}, totals
    steps = set.intersection(*(set(d) for d in per_layer))
    return {int(step): float(sum(d[step] for d in per_layer)) for step in sorted(steps)}, totals


def add_hidden_dfi(out: str) -> int:
    """Add ``plasticity/<network>/dfi_hidden`` to the diagnostics of the run JSONs made before the key existed,
    from their TensorBoard events (:func:`hidden_dfi_from_events`), at the steps of the JSON's own history. The
    events must be the JSON's own run: their network-level ``dfi`` must equal, step for step, the one the JSON
    recorded (to float32 precision, as TensorBoard stores it); a JSON whose events are missing or belong to another
    run (an interrupted attempt's folder) is left as it is and named in a warning. Returns the JSONs updated."""
    updated, missing = 0, []
    for record_path in _run_jsons(out):
        with open(record_path) as f:
            record = json.load(f)
        diagnostics = record.get("diagnostics") or {}
        networks = {k.split("/")[1] for k in diagnostics if k.endswith("/dfi")}
        todo = [n for n in sorted(networks) if f"plasticity/{n}/dfi_hidden" not in diagnostics]
        if not todo:
            continue
        folder = _events_dir(out, record)
        if not folder.is_dir():
            missing.append(str(record_path))
            continue
        for network in todo:
            rebuilt, logged = hidden_dfi_from_events(str(folder), network)
            total = diagnostics[f"plasticity/{network}/dfi"]
            series = [[step, rebuilt[int(step)]] for step, _ in total if int(step) in rebuilt]
            same_run = all(int(step) in logged and math.isclose(logged[int(step)], value, rel_tol=1e-5, abs_tol=1e-6)
                           for step, value in total)
            if len(series) != len(total) or not same_run:
                missing.append(str(record_path))
                break
            diagnostics[f"plasticity/{network}/dfi_hidden"] = series
        else:
            write_record(str(record_path), record)
            updated += 1
    if missing:
        print(f"warning: {len(missing)} run JSONs carry no dfi_hidden and have no matching TensorBoard events under "
              f"{os.path.join(out, 'tb')} to rebuild it from (e.g. {missing[0]}): their hidden-layer DfI is left out",
              flush=True)
    return updated


def add_train_scalars(out: str, setting: Setting) -> int:
    """Copy :data:`TRAIN_SCALARS` from the TensorBoard events under ``out/tb`` (not committed) into the run JSONs
    (committed) that lack them: ``record["train_scalars"] = {tag: [per task]}`` (a fresh agent's list has its one
    task). Returns the number of JSONs updated; a run without its events folder is left as it is, and a warning
    names how many those are."""
    updated, missing = 0, []
    for record_path in _run_jsons(out):
        with open(record_path) as f:
            record = json.load(f)
        if "train_scalars" in record:
            continue
        folder = _events_dir(out, record)
        if not folder.is_dir():
            missing.append(str(record_path))
            continue
        tasks = setting.tasks if record.get("fresh_task") is None else 1
        record["train_scalars"] = train_scalars_per_task(str(folder), setting, tasks)
        write_record(str(record_path), record)
        updated += 1
    if missing:
        print(f"warning: {len(missing)} run JSONs carry no {', '.join(TRAIN_SCALARS)} and have no TensorBoard events "
              f"under {os.path.join(out, 'tb')} to copy them from (e.g. {missing[0]}): their policy entropy is left out "
              "of the tables", flush=True)
    return updated
