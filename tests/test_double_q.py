"""PlasticDQN(double_q=True): the Double DQN target (van Hasselt et al., 2016) against a hand computation, SB3's
target without it, saved with the model, bad input refused."""

from __future__ import annotations

import pytest
import stable_baselines3.dqn.dqn as sb3_dqn
import torch as th
from stable_baselines3 import DQN

from sb3_plastic import PlasticDQN

OFF = dict(isometry_mode="off", optimizer="adam")


def _trained(double_q, seed=0):
    model = PlasticDQN("MlpPolicy", "CartPole-v1", double_q=double_q, learning_starts=100, train_freq=1,
                       gradient_steps=1, target_update_interval=10_000, seed=seed, **OFF)
    model.learn(300)
    with th.no_grad():  # make the target network differ from the online one, so the two targets differ
        for p in model.q_net_target.parameters():
            p.add_(0.5 * th.randn_like(p))
    return model


def _one_update_targets(model, monkeypatch):
    """The TD targets and replay sample of one ``train(1, 64)`` call (SB3's loss function is wrapped to see them)."""
    seen = {}
    loss = sb3_dqn.F.smooth_l1_loss
    sample = model.replay_buffer.sample

    def recording_sample(*args, **kwargs):
        seen["data"] = sample(*args, **kwargs)
        return seen["data"]

    def recording_loss(current, target):
        seen["target"] = target.detach().clone()
        return loss(current, target)

    monkeypatch.setattr(sb3_dqn.F, "smooth_l1_loss", recording_loss)
    monkeypatch.setattr(model.replay_buffer, "sample", recording_sample)
    online_before = [p.detach().clone() for p in model.q_net.parameters()]
    model.train(1, 64)
    monkeypatch.undo()
    return seen["data"], seen["target"], online_before


def test_double_q_target_matches_a_hand_computation(monkeypatch):
    th.manual_seed(0)
    model = _trained(True)
    before_online = {k: v.clone() for k, v in model.q_net.state_dict().items()}
    online = type(model.q_net)(**model.q_net._get_constructor_parameters())  # the online net before the update
    online.load_state_dict(before_online)
    data, target, _ = _one_update_targets(model, monkeypatch)
    with th.no_grad():
        action = online(data.next_observations).argmax(dim=1, keepdim=True)
        evaluated = model.q_net_target(data.next_observations).gather(1, action)
        expected = data.rewards + (1 - data.dones) * model.gamma * evaluated
        sb3_target = data.rewards + (1 - data.dones) * model.gamma * model.q_net_target(
            data.next_observations).max(dim=1, keepdim=True).values
    th.testing.assert_close(target, expected)
    assert not th.allclose(target, sb3_target)  # a different target from SB3's max over the target net
    assert type(model.q_net_target).__name__ == "QNetwork"  # the stand-in is removed after train()


def test_without_double_q_the_target_is_sb3s_max(monkeypatch):
    th.manual_seed(0)
    model = _trained(False)
    data, target, _ = _one_update_targets(model, monkeypatch)
    with th.no_grad():
        expected = data.rewards + (1 - data.dones) * model.gamma * model.q_net_target(
            data.next_observations).max(dim=1, keepdim=True).values
    th.testing.assert_close(target, expected)


def test_double_q_off_trains_bit_for_bit_as_sb3_dqn():
    kwargs = dict(learning_starts=100, train_freq=1, gradient_steps=1, target_update_interval=50, seed=3)
    ours = PlasticDQN("MlpPolicy", "CartPole-v1", activation=None, double_q=False, **OFF, **kwargs).learn(400)
    sb3 = DQN("MlpPolicy", "CartPole-v1", **kwargs).learn(400)
    for a, b in zip(ours.policy.parameters(), sb3.policy.parameters()):
        assert th.equal(a, b)


def test_double_q_changes_training_and_is_saved(tmp_path):
    kwargs = dict(learning_starts=100, train_freq=1, gradient_steps=1, target_update_interval=50, seed=3, **OFF)
    plain = PlasticDQN("MlpPolicy", "CartPole-v1", **kwargs).learn(400)
    double = PlasticDQN("MlpPolicy", "CartPole-v1", double_q=True, **kwargs).learn(400)
    assert any(not th.equal(a, b) for a, b in zip(plain.policy.parameters(), double.policy.parameters()))
    double.save(tmp_path / "d.zip")
    assert PlasticDQN.load(tmp_path / "d.zip").double_q is True
    DQN("MlpPolicy", "CartPole-v1").save(tmp_path / "sb3.zip")  # SB3's DQN: no double_q in the file
    assert PlasticDQN.load(tmp_path / "sb3.zip").double_q is False


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_double_q_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=f"double_q must be True or False, got {bad!r}"):
        PlasticDQN("MlpPolicy", "CartPole-v1", double_q=bad, **OFF)
