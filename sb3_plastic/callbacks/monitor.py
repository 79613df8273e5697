"""PlasticityMonitor: plasticity diagnostics of every network of a model, logged to TensorBoard.

The diagnostics (dead and dormant units, feature rank, weight norms and spectra, deviation from
isometry, gradient norm, conditioning of the empirical NTK) are defined in :mod:`sb3_plastic.diagnostics`.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from typing import Any, Optional

import numpy as np
import torch as th
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

from sb3_plastic.callbacks.base import PlasticCallback, preserved_numpy_rng
from sb3_plastic.callbacks.redo import ReDo, _validate_positive_int, _validate_tau
from sb3_plastic.callbacks.triggers import check_bool
from sb3_plastic.common.surgery import plastic_state_to
from sb3_plastic.diagnostics import MAX_JACOBIAN_ELEMENTS, network_diagnostics, spec_parameters

#: Default period in environment steps. A diagnostics pass costs about as much as 15-35 environment steps of
#: training for SB3's default MLP agents (PPO / DQN on CartPole, SAC on Pendulum) and ~250 for PPO with
#: NatureCNN on 84x84 images (0.6 s at ~400 fps, one CPU thread), i.e. < 1 % (MLP) and ~5 % (CNN) of training
#: time at this period (``bench/overhead.py``, bench/README.md); ``max_overhead`` (2 %) caps the share for
#: anything more expensive, the CNN included.
DEFAULT_EVERY = 5_000


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _unpack_probe(stored: Any, probe_size: int, device: th.device) -> Optional[tuple[Any, Optional[th.Tensor]]]:
    """The probe batch kept in the monitor's persistent state, on ``device``; ``None`` when there is none or it was
    drawn for another ``probe_size`` (the monitor then draws a new one)."""
    if not isinstance(stored, dict) or stored.get("probe_size") != probe_size:
        return None
    return plastic_state_to((stored["observations"], stored["actions"]), device)


class PlasticityMonitor(PlasticCallback):
    """Logs plasticity diagnostics of every online network of a model to SB3's logger (TensorBoard).

    Every ``every`` environment steps (and no more often than keeps its share of wall-clock time under
    ``max_overhead``), on a fixed probe batch, for each network of
    :func:`sb3_plastic.common.surgery.find_networks` (PPO / A2C: ``policy``; DQN: ``q_net``; QR-DQN:
    ``quantile_net``; SAC / TQC / TD3: ``actor`` and ``critic``) it computes
    :func:`sb3_plastic.diagnostics.network_diagnostics` and logs

    * ``plasticity/<net>/<layer>/<metric>`` per layer: ``dormant_fraction`` (Sokar et al., 2023),
      ``zero_fraction``, ``srank`` (Kumar et al., 2021), ``effective_rank`` (Roy & Vetterli, 2007),
      ``feature_norm``, ``feature_variance`` (Plasticine's) for hidden layers; ``weight_norm``, ``dist_from_init``,
      ``dfi``, ``dfi_floor``, ``dfi_ceiling``, ``sigma_max``, ``sigma_min``, ``cond`` for every weight layer (heads
      included); ``dfi_floor`` / ``dfi_ceiling`` split ``dfi`` at its target into the parts from singular values
      below and above ``sqrt(s)`` (a penalty with ``isometry_side="floor"`` acts only while its layers' ``dfi_floor``
      is above 0); ``dfi`` is
      ``||W^T W - s I||_F^2`` (smaller Gram matrix) with ``s`` the model's ``isometry_scale`` (:attr:`isometry_scale`;
      1 for a model without one);
    * ``plasticity/<net>/<metric>`` per network: ``dormant_fraction``, ``zero_fraction``, ``weight_norm``,
      ``dist_from_init``, ``dfi`` (every weight layer, heads included), ``dfi_hidden`` (the same sum without the
      output heads: the layers AdamO regularises by default), ``dfi_free`` / ``dfi_free_hidden`` (the same sums of the
      scale-free DfI, each layer's target its own mean squared singular value: what ``isometry_free_scale``
      penalises, and the one to read for such a model, whose ``dfi`` still measures against ``isometry_scale``),
      ``dfi_floor`` / ``dfi_ceiling`` / ``dfi_floor_hidden`` / ``dfi_ceiling_hidden`` (the per-layer parts summed
      the same two ways),
      ``grad_norm`` and the empirical NTK's ``ntk_cond``,
      ``ntk_log10_cond``
      (``log10`` of ``ntk_cond``: plot this one, the condition number spans many decades; 14 is the cap
      :data:`~sb3_plastic.diagnostics.COND_CAP`, "numerically singular"), ``ntk_erank``, ``ntk_trace``, ``ntk_size``
      (Jacot et al., 2018; Rosseau, Müller & Nowé, 2026), on the first ``ntk_probe_size`` *distinct* probe samples
      (repeated frames, common in MinAtar and Atari rollouts, would make the kernel singular);
    * ``plasticity/return/task_<id>``: mean return of the episodes finished since the last write, per task,
      when the env puts ``info["task_id"]`` in its infos (returns come from the ``info["episode"]`` entries
      of SB3's ``Monitor`` wrapper; an episode counts for the task id of its last step);
    * ``plasticity/task_id``: env 0's task id (numeric ids as they are, others numbered by first
      appearance; the numbering is kept in the persistent state, ``state["task_numbers"]``, so it survives
      save -> load), written at training start and at every change, at the exact step;
    * ``plasticity/monitor_seconds``: total wall-clock time spent in the monitor;
    * ``plasticity/skipped_passes``: passes that ``every`` asked for but ``max_overhead`` skipped (total so far),
      written with every pass and at training end.

    With a ``name``, keys start with ``plasticity/<name>/`` instead.

    The probe batch is drawn once, at the first pass (``resample=False``), and reused, so changes over training
    come from the network, not from the data. It is kept in the persistent state (``self.state["probe"]``) and
    saved with the model, so later ``learn()`` calls and a resumed run (load ->
    ``learn(..., reset_num_timesteps=False)``) measure on the same samples: every diagnostic and the pass schedule
    continue the uninterrupted run's exactly (``tests/test_resume_matrix.py``). A monitor with another
    ``probe_size`` draws a new batch (and keeps that one). The model file grows by the batch: ``probe_size``
    observations and actions in the buffer's dtypes (SB3's buffers keep the observation space's: an 84x84x4 uint8
    Atari batch of 256 is ~7 MB). A model saved before the batch was kept carries none: its first pass draws one,
    so the activation, gradient and NTK diagnostics step there. On-policy, ``probe_size`` rows of the rollout buffer
    at the first rollout end (as :class:`~sb3_plastic.callbacks.redo.ReDo` draws them); off-policy, ``probe_size`` distinct
    transitions of the replay buffer once it holds that many (its actions feed the critics); a replay buffer that can
    never hold ``probe_size`` transitions (``buffer_size < probe_size``) gives all of its transitions once it is full,
    with a ``UserWarning``. On-policy the
    diagnostics run at a rollout end, off-policy in ``_on_step``. A pass changes nothing, so a run with the
    monitor is bit-identical to one without (``tests/test_monitor_side_effects.py``, every supported algorithm):
    numpy's and torch's global random states are saved and restored; the networks run in evaluation mode (as in
    SB3's rollouts: batch-norm statistics are read, never updated) and each module's mode is restored; the same
    ``Parameter`` objects stay in place, trainable and in their optimizers (gradients and NTK with
    :mod:`torch.func` on parameters swapped in and out by :class:`~sb3_plastic.diagnostics.ParameterSwap`); no
    optimizer state or ``.grad`` is touched.

    Writing: the values are recorded with ``self.logger.record`` and dumped at once at the current step
    (``logger.dump(num_timesteps)``), excluded from the ``stdout`` / ``log`` formats (a table of ~100
    rows, whose long keys SB3's console writer would truncate). The keys SB3 had recorded but not dumped
    yet (``train/...`` between two of its dumps) are set aside during that dump and put back, so SB3's own
    logging is unchanged.

    Distances from initialisation use a copy (on CPU) of the trained parameters taken at the first
    training start, kept in the persistent state (``self.state["init"]``): it is saved with the model,
    so ``dist_from_init`` keeps its origin across save -> load -> learn (the model file grows by one copy
    of the networks). A monitor attached to a model that has already trained (``num_timesteps > 0`` or gradient
    updates done, without a saved copy) takes the copy then: its ``dist_from_init`` is the distance from that
    attach point, and a ``UserWarning`` says so.

    Nothing of a pass stops training: non-finite weights or features, layers or heads the probe never reaches,
    initial weights of another shape give NaN or missing metrics (see
    :func:`~sb3_plastic.diagnostics.network_diagnostics`) and a ``UserWarning`` naming the network and layer,
    once per cause and monitor.

    :param every: environment steps between two diagnostics passes (the first pass happens at the first
        opportunity: first rollout end, or once the replay buffer holds ``probe_size`` transitions).
        The default (:data:`DEFAULT_EVERY`) costs < 5 % of training time (``bench/monitor_overhead.py``).
    :param probe_size: probe samples for the activation and gradient diagnostics.
    :param ntk_probe_size: probe samples for the empirical NTK (its size is samples x outputs; fewer samples
        are used when that would exceed ``ntk_max_rows``); 0 skips the NTK.
    :param tau: dormancy threshold in (0, 1] (0.025 as ReDo).
    :param ntk_max_rows: largest NTK dimension (samples x outputs).
    :param max_elements: memory budget of the Jacobian blocks, in entries.
    :param max_overhead: cap on the monitor's share of wall-clock time (``None``: no cap). After a pass that took
        ``t`` seconds, the next one also waits until ``t / max_overhead`` seconds of training have passed, so an
        expensive network (a large CNN, a fast GPU rollout) is measured less often instead of slowing training.
        The cap overrides ``every``: each time ``every`` steps have passed since the last pass (or skipped pass)
        and the cap holds the pass back, it counts as skipped (``plasticity/skipped_passes``, ``state["skipped"]``),
        and the first skip raises a ``UserWarning`` with the numbers. ``max_overhead=None`` runs every pass.
    :param resample: draw a new probe batch at every pass instead of reusing the first one (none is kept in the
        persistent state).
    :param name: distinguishes two monitors on one model (state key and log prefix).
    :param verbose: 1 prints one line per pass.
    """

    def __init__(
        self,
        every: int = DEFAULT_EVERY,
        probe_size: int = 256,
        ntk_probe_size: int = 32,
        tau: float = 0.025,
        ntk_max_rows: int = 256,
        max_elements: int = MAX_JACOBIAN_ELEMENTS,
        max_overhead: Optional[float] = 0.02,
        resample: bool = False,
        name: Optional[str] = None,
        verbose: int = 0,
    ) -> None:
        super().__init__(name=name, verbose=verbose)
        self.every = _validate_positive_int("every", every)
        self.probe_size = _validate_positive_int("probe_size", probe_size)
        if isinstance(ntk_probe_size, bool) or not isinstance(ntk_probe_size, (int, np.integer)) or ntk_probe_size < 0:
            raise ValueError(f"ntk_probe_size must be an integer >= 0, got {ntk_probe_size!r}")
        self.ntk_probe_size = int(ntk_probe_size)
        self.tau = _validate_tau(tau)
        self.ntk_max_rows = _validate_positive_int("ntk_max_rows", ntk_max_rows)
        self.max_elements = _validate_positive_int("max_elements", max_elements)
        if max_overhead is not None and not (isinstance(max_overhead, (int, float)) and 0 < max_overhead < 1):
            raise ValueError(f"max_overhead must be a number in (0, 1) or None, got {max_overhead!r}")
        self.max_overhead = max_overhead
        check_bool("resample", resample)
        self.resample = resample
        self._pass_seconds = 0.0
        self._pass_end = 0.0
        self._schedule_step: Optional[int] = None
        self._skipped_written: Optional[int] = None
        self._warned_skip = False
        self._on_policy = False
        self._probe: Optional[tuple[Any, Optional[th.Tensor]]] = None
        self._last_step: Optional[int] = None
        self._env_tasks: dict[int, Any] = {}
        self._task_returns: dict[Any, list[float]] = defaultdict(list)
        self._task_numbers: dict[Any, float] = {}
        self._logged_task: Any = None
        self._warned: set = set()

    @property
    def prefix(self) -> str:
        """Log key prefix: ``plasticity`` or ``plasticity/<name>``."""
        return "plasticity" if self.name is None else f"plasticity/{self.name}"

    # ------------------------------------------------------------------ lifecycle
    def _on_training_start(self) -> None:
        super()._on_training_start()
        self._on_policy = isinstance(self.model, OnPolicyAlgorithm)
        self._probe = None
        if self.resample:
            self.state.pop("probe", None)  # no fixed batch to keep
        else:
            self._probe = _unpack_probe(self.state.get("probe"), self.probe_size, self.model.device)
        init = self.state.setdefault("init", {})
        trained = int(getattr(self.model, "_n_updates", 0) or 0)
        late = []
        for spec in self.networks:
            if spec.name not in init:
                init[spec.name] = {k: v.detach().to("cpu", copy=True) for k, v in spec_parameters(spec).items()}
                if self.num_timesteps > 0 or trained > 0:
                    late.append(spec.name)
        if late and ("late_init", tuple(late)) not in self._warned:
            self._warned.add(("late_init", tuple(late)))
            warnings.warn(
                f"PlasticityMonitor: attached to a model that has already trained (num_timesteps={self.num_timesteps}, "
                f"{trained} gradient updates): the initial weights of {', '.join(repr(n) for n in late)} are taken now, "
                f"so '{self.prefix}/<net>/dist_from_init' is the distance from this attach point, not from the "
                "model's initialisation. Attach the monitor from the first learn() call for the distance from "
                "initialisation.",
                stacklevel=2,
            )
        # non-numeric task ids keep their numbers across save -> load (the mapping is saved with the model)
        self._task_numbers = self.state.setdefault("task_numbers", {})
        self.state.setdefault("events", 0)
        self.state.setdefault("seconds", 0.0)
        self.state.setdefault("skipped", 0)
        self._last_step = self.state.get("last_step")
        self._schedule_step = self._last_step
        self._skipped_written = None
        self._logged_task = None
        self._pass_seconds = 0.0

    def _on_step(self) -> bool:
        self._track_episodes()
        if not self._on_policy:
            self._check()
        return True

    def _on_rollout_end(self) -> None:
        if self._on_policy:
            self._check()

    def _on_training_end(self) -> None:
        values = self._return_values()
        skipped = int(self.state.get("skipped", 0))
        if skipped != self._skipped_written:
            values[f"{self.prefix}/skipped_passes"] = float(skipped)
            self._skipped_written = skipped
        if values:
            self._write(values)

    def _check(self) -> None:
        """Run a pass if one is :attr:`due`; count a skipped pass when ``every`` asks for one that the
        ``max_overhead`` cap postpones."""
        if self.due:
            if self.run():
                self._schedule_step = self.num_timesteps
            return
        if self._schedule_step is None or self.num_timesteps - self._schedule_step < self.every:
            return
        # every steps have passed since the last pass (or skipped pass): only the cap holds this one back
        self._schedule_step = self.num_timesteps
        self.state["skipped"] = int(self.state.get("skipped", 0)) + 1
        if not self._warned_skip:
            self._warned_skip = True
            waited = time.perf_counter() - self._pass_end
            warnings.warn(
                f"PlasticityMonitor: max_overhead={self.max_overhead} skips the pass that every={self.every} asks for "
                f"at step {self.num_timesteps}: the last pass took {self._pass_seconds:.3g} s, so the next one waits "
                f"for {self._pass_seconds / self.max_overhead:.3g} s of training after it ({waited:.3g} s so far). "
                f"Skipped passes are counted in '{self.prefix}/skipped_passes'; pass max_overhead=None for a pass "
                f"every {self.every} steps, or a larger max_overhead.",
                stacklevel=2,
            )

    @property
    def due(self) -> bool:
        """Whether a pass is due: none happened yet, or ``every`` steps have passed since the last one and (with
        ``max_overhead``) enough training time to keep the monitor's share of wall-clock time under the cap."""
        if self._last_step is None:
            return True
        if self.num_timesteps - self._last_step < self.every:
            return False
        if self.max_overhead is None:
            return True
        return time.perf_counter() - self._pass_end >= self._pass_seconds / self.max_overhead

    # ------------------------------------------------------------------ probe
    def _draw_probe(self) -> Optional[tuple[Any, Optional[th.Tensor]]]:
        with preserved_numpy_rng():
            if self._on_policy:
                return ReDo._rollout_probe(self)  # type: ignore[arg-type]  # needs .model and .probe_size
            buffer = getattr(self.model, "replay_buffer", None)
            if buffer is None:
                return None
            n_rows = buffer.size()
            size = self.probe_size
            if n_rows < size:
                capacity = int(buffer.buffer_size)
                if capacity >= size or not buffer.full:
                    return None  # not enough transitions yet: the buffer will hold probe_size of them
                size = n_rows  # the buffer can never hold probe_size transitions: use all it holds once full
                if "small_buffer" not in self._warned:
                    self._warned.add("small_buffer")
                    warnings.warn(
                        f"PlasticityMonitor: the replay buffer holds at most {capacity} transitions, fewer than "
                        f"probe_size={self.probe_size}: the probe batch is the {size} transitions of the full buffer "
                        f"(first pass at step {self.num_timesteps}, once it is full). Pass probe_size <= {capacity} "
                        "to silence this.",
                        stacklevel=3,
                    )
            idx = np.random.choice(n_rows, size=size, replace=False)
            data = buffer._get_samples(idx, env=getattr(self.model, "_vec_normalize_env", None))
            return data.observations, data.actions

    # ------------------------------------------------------------------ the pass
    def run(self) -> dict[str, float]:
        """Compute every network's diagnostics now on the probe batch and write them; returns the logged values
        (``{}`` when no probe batch can be drawn yet)."""
        start = time.perf_counter()
        if self._probe is None or self.resample:
            self._probe = self._draw_probe()
            if self._probe is not None and not self.resample:
                observations, actions = self._probe
                self.state["probe"] = {"probe_size": self.probe_size, "observations": observations, "actions": actions}
        if self._probe is None:
            return {}
        observations, actions = self._probe
        values: dict[str, float] = {}
        init = self.state.get("init", {})
        scale = self.isometry_scale
        for spec in self.networks:
            metrics = network_diagnostics(
                self.model,
                spec,
                observations,
                actions if spec.name == "critic" else None,
                tau=self.tau,
                initial=init.get(spec.name),
                ntk_size=self.ntk_probe_size,
                ntk_max_rows=self.ntk_max_rows,
                max_elements=self.max_elements,
                dfi_scale=scale,
                warned=self._warned,
            )
            values.update({f"{self.prefix}/{spec.name}/{k}": v for k, v in metrics.items()})
        values.update(self._return_values())
        self._last_step = self.num_timesteps
        self.state["last_step"] = self.num_timesteps
        self.state["events"] = int(self.state.get("events", 0)) + 1
        self._skipped_written = int(self.state.get("skipped", 0))
        values[f"{self.prefix}/skipped_passes"] = float(self._skipped_written)
        values[f"{self.prefix}/monitor_seconds"] = float(self.state.get("seconds", 0.0)) + time.perf_counter() - start
        self._write(values)
        self._pass_end = time.perf_counter()
        self._pass_seconds = self._pass_end - start
        self.state["seconds"] = float(self.state.get("seconds", 0.0)) + self._pass_seconds
        if self.verbose >= 1:
            summary = ", ".join(
                f"{spec.name}: dormant {values.get(f'{self.prefix}/{spec.name}/dormant_fraction', float('nan')):.3f} "
                f"NTK cond {values.get(f'{self.prefix}/{spec.name}/ntk_cond', float('nan')):.3g}"
                for spec in self.networks
            )
            skipped = f" ({self._skipped_written} passes skipped by max_overhead)" if self._skipped_written else ""
            print(f"PlasticityMonitor at step {self.num_timesteps}: {summary}{skipped}")
        return values

    @property
    def isometry_scale(self) -> float:
        """Target scale ``s`` of the logged DfI ``||W^T W - s I||_F^2``: the model's ``isometry_scale`` (plastic
        algorithms and policies, :class:`~sb3_plastic.config.IsometryConfig`), else 1."""
        for owner in (self.model, getattr(self.model, "policy", None)):
            config = getattr(owner, "isometry_config", None)
            scale = getattr(config, "isometry_scale", None)
            if scale is not None:
                return float(scale)
        return 1.0

    # ------------------------------------------------------------------ tasks and returns
    def _task_number(self, task: Any) -> float:
        if isinstance(task, (int, float)) and not isinstance(task, bool):
            return float(task)
        return self._task_numbers.setdefault(task, float(len(self._task_numbers)))

    def _track_episodes(self) -> None:
        infos = self.locals.get("infos")
        if not infos:
            return
        for i, info in enumerate(infos):
            if not isinstance(info, dict):
                continue
            if "task_id" in info:
                self._env_tasks[i] = _plain(info["task_id"])
            episode = info.get("episode")
            if isinstance(episode, dict) and "r" in episode and i in self._env_tasks:
                self._task_returns[self._env_tasks[i]].append(float(episode["r"]))
        task = self._env_tasks.get(0)
        if 0 in self._env_tasks and (self._logged_task is None or task != self._logged_task):
            values = self._return_values()  # the previous task's last episodes, before the switch is marked
            values[f"{self.prefix}/task_id"] = self._task_number(task)
            self._logged_task = task
            self._write(values)

    def _return_values(self) -> dict[str, float]:
        values = {
            f"{self.prefix}/return/task_{task}": float(np.mean(returns))
            for task, returns in self._task_returns.items()
            if returns
        }
        self._task_returns.clear()
        return values

    # ------------------------------------------------------------------ writing
    def _write(self, values: dict[str, float]) -> None:
        """Record ``values`` and dump them now at ``num_timesteps``, leaving SB3's pending keys untouched."""
        logger = self.logger
        pending = (dict(logger.name_to_value), dict(logger.name_to_count), dict(logger.name_to_excluded))
        logger.name_to_value.clear()
        logger.name_to_count.clear()
        logger.name_to_excluded.clear()
        try:
            for key, value in values.items():
                logger.record(key, value, exclude=("stdout", "log"))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Tried to write empty key-value dict")
                logger.dump(self.num_timesteps)
        finally:
            logger.name_to_value.clear()
            logger.name_to_count.clear()
            logger.name_to_excluded.clear()
            logger.name_to_value.update(pending[0])
            logger.name_to_count.update(pending[1])
            logger.name_to_excluded.update(pending[2])
