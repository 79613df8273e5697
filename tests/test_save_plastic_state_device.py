"""The interventions' persistent state across devices (audit): what ``save`` pickles (of a plastic or a plain SB3
model) holds only CPU tensors (a CUDA save must load on a CPU-only machine; SB3 drops an attribute it cannot
unpickle, and with it every intervention's state); after ``load`` each callback moves what it reads to its network's
device when it binds (L2-init's ``theta_0``, the spectral vectors), and L2-init's in-place penalty works there."""

from __future__ import annotations

import pickle

import gymnasium as gym
import pytest
import torch as th
from stable_baselines3.common.save_util import load_from_zip_file

from sb3_plastic import PlasticPPO
from sb3_plastic.common import surgery
from sb3_plastic.common.surgery import PlasticStateStore

KWARGS = dict(n_steps=64, batch_size=32, n_epochs=1, seed=0, policy_kwargs=dict(net_arch=[8]))
PLASTIC = dict(l2_init_coef=1e-3, spectral_coef=1e-3, fire_at=0.5)


def _tensors(obj):
    if isinstance(obj, PlasticStateStore):
        obj = obj.data
    if isinstance(obj, th.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


def _spy_mover(monkeypatch, module) -> list[th.device]:
    """Record the device of every call of ``module.plastic_state_to`` (which still runs)."""
    calls: list[th.device] = []
    original = module.plastic_state_to

    def spy(state, device):
        calls.append(th.device(device))
        return original(state, device)

    monkeypatch.setattr(module, "plastic_state_to", spy)
    return calls


def _trained(device="cpu"):
    model = PlasticPPO("MlpPolicy", "CartPole-v1", device=device, **KWARGS, **PLASTIC)
    model.learn(128)
    return model


def test_pickling_writes_a_cpu_copy_of_the_state_and_keeps_the_live_one(monkeypatch):
    model = _trained()
    live = model.plastic_state
    before = {id(t) for t in _tensors(live)}
    calls = _spy_mover(monkeypatch, surgery)
    pickled = live.__getstate__()
    assert calls == [th.device("cpu")]  # every tensor to the CPU
    assert model.plastic_state is live and {id(t) for t in _tensors(live)} == before  # the live state is untouched
    saved = pickle.loads(pickle.dumps(live))
    assert isinstance(saved, PlasticStateStore) and saved.keys() == live.keys() and pickled["data"].keys() == live.keys()
    tensors = list(_tensors(saved))
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    for a, b in zip(_tensors(saved), _tensors(live)):
        assert th.equal(a, b.cpu())


def test_plastic_state_to_copies_the_nest_with_every_tensor_moved():
    store = PlasticStateStore()
    rng = th.Generator().manual_seed(3).get_state()
    store.data["A"] = {"theta0": {"w": th.ones(2, dtype=th.float64)}, "rng": {"cpu": rng}, "n": 3, "l": [th.zeros(1)]}
    moved = surgery.plastic_state_to(store, "cpu")
    assert isinstance(moved, PlasticStateStore) and moved is not store and moved.data is not store.data
    assert moved.data["A"]["rng"]["cpu"].dtype == th.uint8 and moved.data["A"]["n"] == 3
    th.Generator().set_state(moved.data["A"]["rng"]["cpu"])  # still a valid CPU generator state
    assert th.equal(moved.data["A"]["theta0"]["w"], th.ones(2, dtype=th.float64))
    assert isinstance(moved.data["A"]["l"], list) and th.equal(moved.data["A"]["l"][0], th.zeros(1))


def test_cpu_save_load_keeps_every_intervention_state(tmp_path):
    model = _trained()
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"))
    assert loaded.plastic_state.keys() == model.plastic_state.keys()
    fire = next(v for k, v in loaded.plastic_state.data.items() if k.startswith("FIRE"))
    assert fire["count"] == 1
    loaded.learn(64, reset_num_timesteps=False)
    assert fire["count"] == 1


# ---------------------------------------------------------------------------------------------------
# On a GPU (skipped without CUDA, as tests/test_cuda.py)
# ---------------------------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not th.cuda.is_available(), reason="needs CUDA")


def _state_of(model, prefix):
    return next(v for k, v in model.plastic_state.data.items() if k.startswith(prefix))


@cuda
def test_cuda_save_cpu_load(tmp_path):
    model = _trained("cuda")
    assert any(t.device.type == "cuda" for t in _tensors(model.plastic_state))
    model.save(tmp_path / "m.zip")
    data, _, _ = load_from_zip_file(tmp_path / "m.zip", device="cpu")
    assert all(t.device.type == "cpu" for t in _tensors(data["plastic_state"]))  # loads on a CPU-only machine
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"), device="cpu")
    assert loaded.plastic_state.keys() == model.plastic_state.keys()
    assert _state_of(loaded, "FIRE")["count"] == 1
    assert all(t.device.type == "cpu" for t in _tensors(loaded.plastic_state))
    loaded.learn(64, reset_num_timesteps=False)  # L2-init and spectral penalties on the CPU
    assert _state_of(loaded, "FIRE")["count"] == 1  # FIRE does not fire again


@cuda
def test_cpu_save_cuda_load(tmp_path):
    model = _trained("cpu")
    model.save(tmp_path / "m.zip")
    loaded = PlasticPPO.load(tmp_path / "m.zip", env=gym.make("CartPole-v1"), device="cuda")
    loaded.learn(64, reset_num_timesteps=False)  # the in-place L2-init penalty on CUDA parameters
    theta0 = _state_of(loaded, "L2Init")["theta0"]  # moved to the parameters' device when the callbacks bound
    assert all(t.device.type == "cuda" for t in theta0.values())
    assert all(t.device.type == "cuda" for t in _state_of(loaded, "SpectralRegularisation")["u"].values())
    assert _state_of(loaded, "FIRE")["count"] == 1
    assert all(th.isfinite(p).all() for p in loaded.policy.parameters())


def test_plain_sb3_model_with_plastic_callbacks_pickles_its_state_through_the_cpu(tmp_path, monkeypatch):
    """A plain SB3 model with the plastic callbacks has the same store, saved by SB3's own ``save``: it is pickled
    through the CPU mover too (a CUDA-trained plain model must load on a CPU-only machine), and comes back whole."""
    from stable_baselines3 import PPO

    from sb3_plastic.callbacks import FIRE, L2Init

    model = PPO("MlpPolicy", "CartPole-v1", **KWARGS)
    model.learn(128, callback=[L2Init(1e-3), FIRE(at=0.5)])
    calls = _spy_mover(monkeypatch, surgery)
    model.save(tmp_path / "plain.zip")
    assert calls == [th.device("cpu")]
    loaded = PPO.load(tmp_path / "plain.zip")
    assert loaded.plastic_state.keys() == model.plastic_state.keys()
    theta0 = _state_of(loaded, "L2Init")["theta0"]
    for key, value in _state_of(model, "L2Init")["theta0"].items():
        assert th.equal(theta0[key], value.cpu())


@cuda
def test_cuda_plain_sb3_save_cpu_load(tmp_path):
    from stable_baselines3 import PPO

    from sb3_plastic.callbacks import FIRE, L2Init

    model = PPO("MlpPolicy", "CartPole-v1", device="cuda", **KWARGS)
    model.learn(128, callback=[L2Init(1e-3), FIRE(at=0.5)])
    assert any(t.device.type == "cuda" for t in _tensors(model.plastic_state))
    model.save(tmp_path / "plain.zip")
    data, _, _ = load_from_zip_file(tmp_path / "plain.zip", device="cpu")
    assert all(t.device.type == "cpu" for t in _tensors(data["plastic_state"]))
    loaded = PPO.load(tmp_path / "plain.zip", env=gym.make("CartPole-v1"), device="cpu")
    assert loaded.plastic_state.keys() == model.plastic_state.keys()
    fire = FIRE(at=0.5)
    loaded.learn(64, callback=[L2Init(1e-3), fire], reset_num_timesteps=False)  # the state binds to the CPU model
    assert _state_of(loaded, "FIRE")["count"] == 1
