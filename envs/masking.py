"""A small gymnasium env with invalid-action masks, for MaskablePPO runs through rl_zoo3.

sb3-contrib ships :class:`~sb3_contrib.common.envs.InvalidActionEnvDiscrete` (an identity task: the reward
is 1 when the action equals the observation; some other actions are invalid at each step) but does not
register it with gymnasium, so rl_zoo3's ``--env`` cannot name it. :class:`InvalidActionDiscreteEnv` is
that env, registered as ``sb3_plastic/InvalidActionDiscrete-v0``, with one change: the state and the set
of invalid actions are drawn from the env's own seeded generator (``self.np_random``) instead of the
action space's and numpy's global ones, so ``reset(seed=...)`` makes an episode reproducible (gymnasium's
env checker requires it). The env is stationary: it exists to exercise action masks, not plasticity.
"""

from __future__ import annotations

import numpy as np
from sb3_contrib.common.envs import InvalidActionEnvDiscrete


class InvalidActionDiscreteEnv(InvalidActionEnvDiscrete):
    """Identity task over ``Discrete(dim)`` where ``n_invalid_actions`` actions (never the correct one) are
    masked at every step; ``action_masks()`` returns a boolean array of length ``dim`` (True = valid).

    :param dim: number of observations and actions (>= 2).
    :param ep_length: steps per episode (the episode is truncated after them).
    :param n_invalid_actions: actions masked at each step, in ``[0, dim - 1]``.
    """

    def __init__(self, dim: int = 16, ep_length: int = 100, n_invalid_actions: int = 8) -> None:
        if not isinstance(dim, (int, np.integer)) or dim < 2:
            raise ValueError(f"dim must be an int >= 2, got {dim!r}")
        if not isinstance(ep_length, (int, np.integer)) or ep_length < 1:
            raise ValueError(f"ep_length must be an int >= 1, got {ep_length!r}")
        if not isinstance(n_invalid_actions, (int, np.integer)) or not 0 <= n_invalid_actions < dim:
            raise ValueError(f"n_invalid_actions must be an int in [0, dim - 1] = [0, {dim - 1}], got {n_invalid_actions!r}")
        super().__init__(dim=int(dim), ep_length=int(ep_length), n_invalid_actions=int(n_invalid_actions))

    def _choose_next_state(self) -> None:
        n = int(self.action_space.n)
        self.state = int(self.np_random.integers(n))
        others = np.array([a for a in range(n) if a != self.state], dtype=np.int64)
        self.invalid_actions = sorted(int(a) for a in self.np_random.choice(others, self.n_invalid_actions, replace=False))

    def action_masks(self) -> np.ndarray:  # type: ignore[override]
        """Boolean mask over the actions: ``True`` where the action is valid in the current state."""
        masks = np.ones(int(self.action_space.n), dtype=bool)
        masks[self.invalid_actions] = False
        return masks
