"""Base class of the plasticity interventions: SB3 callbacks that work on any supported algorithm."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from sb3_plastic.common.surgery import NetworkSpec, find_networks, model_state


@contextlib.contextmanager
def preserved_numpy_rng() -> Iterator[None]:
    """Run the block with numpy's global random state saved and restored afterwards.

    Probe batches are drawn with numpy's global generator (SB3's buffers sample with it); restoring it means a
    callback that only looks (or finds nothing to reset) leaves the run on the trajectory it would follow
    without the callback.
    """
    state = np.random.get_state()
    try:
        yield
    finally:
        np.random.set_state(state)


class PlasticCallback(BaseCallback):
    """An SB3 ``BaseCallback`` that knows the model's networks and keeps persistent state on the model.

    * ``self.networks``: :func:`sb3_plastic.common.surgery.find_networks` of the model, refreshed at each
      training start (a loaded model has new modules and optimizers).
    * ``self.state``: a dict stored in ``model.plastic_state[self.state_key]`` (a
      :class:`~sb3_plastic.common.surgery.PlasticStateStore`); SB3's ``save`` pickles it
      with the model and ``load`` restores it, so counters and statistics survive save -> load -> learn
      when the same callback (same ``name``) is passed to ``learn`` again.
    * :meth:`record`: logs under ``plasticity/<key>`` through SB3's logger.

    :param name: distinguishes two callbacks of the same class on one model (part of ``state_key``).
    :param verbose: SB3 verbosity.
    """

    def __init__(self, name: Optional[str] = None, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.name = name
        self.networks: list[NetworkSpec] = []
        self.state: dict[str, Any] = {}

    @property
    def state_key(self) -> str:
        """Key of this callback's persistent state on the model."""
        return type(self).__name__ if self.name is None else f"{type(self).__name__}:{self.name}"

    def _init_callback(self) -> None:
        self.networks = find_networks(self.model)
        self.state = model_state(self.model, self.state_key)

    def _on_training_start(self) -> None:
        # learn() may be called on a freshly loaded model: rebind to its modules and state.
        self.networks = find_networks(self.model)
        self.state = model_state(self.model, self.state_key)

    def _on_step(self) -> bool:
        return True

    def record(self, key: str, value: Any) -> None:
        """``logger.record("plasticity/<key>", value)`` for TensorBoard / CSV / JSON.

        Kept out of the stdout table and text log: SB3 truncates keys there to 36 characters and raises
        when two per-layer keys truncate to the same text.
        """
        self.logger.record(f"plasticity/{key}", value, exclude=("stdout", "log"))

    @property
    def gradient_steps(self) -> int:
        """Gradient updates done so far by the model (SB3's ``_n_updates``; PPO counts epochs)."""
        return int(getattr(self.model, "_n_updates", 0))
