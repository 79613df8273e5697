"""PlasticDQN(td_loss="mse"): the squared TD error of C-CHAIN's Double DQN (Tang et al., 2025) in place of SB3's Huber
loss, against a hand computation on the same replay sample; SB3's loss restored after each update and by default;
saved with the model; bad input refused."""

from __future__ import annotations

import numpy as np
import pytest
import stable_baselines3.dqn.dqn as sb3_dqn
import torch as th
import torch.nn.functional as F
from stable_baselines3 import DQN

from sb3_plastic import PlasticDQN

OFF = dict(isometry_mode="off", optimizer="adam")
KW = dict(learning_starts=100, train_freq=1, gradient_steps=1, target_update_interval=10_000, seed=0, **OFF)


def _loss_of_one_update(model, seed=1):
    """``(logged loss, hand-computed MSE, hand-computed Huber)`` of one ``train(1, 64)`` on a seeded replay sample."""
    np.random.seed(seed)
    data = model.replay_buffer.sample(64, env=model._vec_normalize_env)
    with th.no_grad():
        q_next = model.q_net_target(data.next_observations)
        if model.double_q:
            a = model.q_net(data.next_observations).argmax(dim=1, keepdim=True)
            best = q_next.gather(1, a)
        else:
            best = q_next.max(dim=1, keepdim=True).values
        target = data.rewards + (1 - data.dones) * model.gamma * best
        current = model.q_net(data.observations).gather(1, data.actions.long())
    np.random.seed(seed)
    model.train(1, 64)
    logged = model.logger.name_to_value["train/loss"]
    return logged, float(F.mse_loss(current, target)), float(F.smooth_l1_loss(current, target))


@pytest.mark.parametrize("double_q", [False, True])
def test_mse_loss_matches_a_hand_computation_and_sb3s_loss_is_restored(double_q):
    th.manual_seed(0)
    model = PlasticDQN("MlpPolicy", "CartPole-v1", td_loss="mse", double_q=double_q, **KW).learn(300)
    logged, mse, huber = _loss_of_one_update(model)
    assert logged == pytest.approx(mse, rel=1e-6) and mse != pytest.approx(huber, rel=1e-3)
    assert sb3_dqn.F.smooth_l1_loss(th.zeros(1), th.full((1,), 3.0)) == 2.5  # Huber again after the update
    huber_model = PlasticDQN("MlpPolicy", "CartPole-v1", double_q=double_q, **KW).learn(300)
    logged, mse, huber = _loss_of_one_update(huber_model)
    assert logged == pytest.approx(huber, rel=1e-6)


def test_huber_default_trains_bit_for_bit_as_sb3_dqn_and_mse_differs(tmp_path):
    kwargs = dict(learning_starts=100, train_freq=1, gradient_steps=1, target_update_interval=50, seed=3)
    ours = PlasticDQN("MlpPolicy", "CartPole-v1", activation=None, td_loss="huber", **OFF, **kwargs).learn(400)
    sb3 = DQN("MlpPolicy", "CartPole-v1", **kwargs).learn(400)
    assert all(th.equal(a, b) for a, b in zip(ours.policy.parameters(), sb3.policy.parameters()))
    mse = PlasticDQN("MlpPolicy", "CartPole-v1", activation=None, td_loss="mse", **OFF, **kwargs).learn(400)
    assert any(not th.equal(a, b) for a, b in zip(mse.policy.parameters(), sb3.policy.parameters()))
    mse.save(tmp_path / "m.zip")
    assert PlasticDQN.load(tmp_path / "m.zip").td_loss == "mse"
    sb3.save(tmp_path / "sb3.zip")  # SB3's DQN: no td_loss in the file
    assert PlasticDQN.load(tmp_path / "sb3.zip").td_loss == "huber"


@pytest.mark.parametrize("bad", ["l2", None, 1])
def test_td_loss_must_be_huber_or_mse(bad):
    with pytest.raises(ValueError, match=f"td_loss must be 'huber' or 'mse', got {bad!r}"):
        PlasticDQN("MlpPolicy", "CartPole-v1", td_loss=bad, **OFF)


def test_the_squared_loss_is_confined_to_its_thread():
    """Two threads in SB3's loss at once (optuna's n_jobs): the one inside a td_loss="mse" update gets the squared
    error, the other SB3's Huber loss."""
    import threading

    from sb3_plastic.dqn import _squared_td_loss

    inside, release, seen = threading.Event(), threading.Event(), {}
    x, y = th.zeros(1), th.full((1,), 3.0)

    def squared():
        with _squared_td_loss():
            inside.set()
            release.wait(10)
            seen["mse"] = float(sb3_dqn.F.smooth_l1_loss(x, y))

    worker = threading.Thread(target=squared)
    worker.start()
    inside.wait(10)
    seen["huber"] = float(sb3_dqn.F.smooth_l1_loss(x, y))
    release.set()
    worker.join(10)
    assert seen == {"mse": 9.0, "huber": 2.5}
    assert sb3_dqn.F.relu is F.relu  # every other name is torch's
