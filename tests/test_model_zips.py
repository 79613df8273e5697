"""Files that are not a whole model zip, and SB3 zips of an older layout (issue #31).

* A file that is not a zip: SB3's ``ValueError("... wasn't a zip-file")`` from every plastic class's ``load`` (it
  raised ``zipfile.BadZipFile``), and ``sb3-plastic train -i`` prints it as a launcher error, no traceback.
* A truncated zip (or a zip without SB3's ``data`` entry): ``ValueError`` naming the file and the missing entry (it
  raised ``KeyError: There is no item named 'data'``).
* A DQN zip saved before SB3 2.4 (its optimizer also holds the target network): ``PlasticDQN.set_parameters`` with
  AdamO maps the online parameters' Adam state and warns as SB3 does, and ``load`` of such a plastic file works
  (SB3's ``test_save_load_no_target_params``); it raised a param-group ``ValueError``.
"""

from __future__ import annotations

import gc
import warnings
import zipfile

import gymnasium as gym
import pytest
import torch as th
from stable_baselines3 import DQN, PPO
from test_sb3_parity import PAIRS

from sb3_plastic import PlasticDQN, PlasticPPO, PlasticQRDQN, zoo


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("zips") / "ppo.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=32, policy_kwargs=dict(net_arch=[8])).save(path)
    return path


@pytest.mark.parametrize("plastic_cls", list(PAIRS), ids=lambda c: c.__name__)
def test_a_file_that_is_not_a_zip_is_sb3s_value_error(tmp_path, plastic_cls):
    bad = tmp_path / "not_a_zip.zip"
    bad.write_text("this is not a zip file")
    with pytest.raises(ValueError, match=r"not_a_zip\.zip wasn't a zip-file"):
        plastic_cls.load(str(bad))


def test_a_truncated_zip_or_one_without_data_says_so(tmp_path, saved):
    whole = saved.read_bytes()
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"truncated\.zip (wasn't a zip-file|is not a whole model zip)"):
        PlasticPPO.load(truncated)
    no_data = tmp_path / "no_data.zip"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(no_data, "w") as out:
        for name in source.namelist():
            if name != "data":
                out.writestr(name, source.read(name))
    with pytest.raises(ValueError, match=r"no_data\.zip is not a whole model zip.*no 'data' entry.*policy\.pth"):
        PlasticPPO.load(no_data)
    assert type(PlasticPPO.load(saved).policy).__name__ == "PlasticActorCriticPolicy"  # the whole file loads


def test_train_i_with_a_corrupt_zip_is_a_launcher_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "corrupt.zip"
    bad.write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(SystemExit) as info:
        zoo.train(["--algo", "plastic_ppo", "--env", "CartPole-v1", "-n", "64", "--eval-freq", "-1", "-f", "logs",
                   "--verbose", "0", "-i", str(bad)])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "sb3-plastic train: error: cannot continue from" in err and "corrupt.zip wasn't a zip-file" in err
    assert "Traceback" not in err


def test_train_i_with_a_corrupt_zip_closes_the_env_it_built(tmp_path, monkeypatch, capsys):
    """rl_zoo3 builds the training env (its Monitor files open) before it loads ``-i``: the launcher error closes it,
    so an in-process caller is not left with open monitor.csv files for the garbage collector to warn about."""
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "corrupt.zip"
    bad.write_bytes(b"PK\x03\x04 truncated")
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(SystemExit):
                zoo.train(["--algo", "plastic_ppo", "--env", "CartPole-v1", "-n", "64", "--eval-freq", "-1",
                           "-f", "logs", "--verbose", "0", "-i", str(bad)])
            gc.collect()  # what the error path left unclosed is freed (and warned about) here at the latest
    finally:
        gc.enable()
    assert list(tmp_path.glob("logs/**/*monitor.csv")), "the run built no Monitor files: the test tests nothing"
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [m for m in unclosed if "monitor.csv" in m], unclosed


def _pre_24_dqn_zip(path, cls=DQN, **kwargs):
    """A DQN file as SB3 < 2.4 saved it: one Adam group over the online and the target network's parameters (SB3's
    own test builds it this way), trained a little so the online parameters have Adam moments."""
    model = cls("MlpPolicy", "CartPole-v1", buffer_size=1000, learning_starts=16, train_freq=4, seed=0,
                policy_kwargs=dict(net_arch=[16]), **kwargs)
    model.policy.optimizer = th.optim.Adam(model.policy.parameters(), lr=1e-3)
    model.learn(64)
    model.save(path)
    return model


@pytest.mark.parametrize("plastic_cls", [PlasticDQN, PlasticQRDQN], ids=lambda c: c.__name__)
def test_set_parameters_of_a_pre_24_dqn_zip_maps_the_online_adam_state(tmp_path, plastic_cls):
    """The README's route to continue an SB3 model with the penalty on: the online parameters get their Adam moments
    (matched by name), SB3's hyperparameters, the plastic groups keep their isometry settings; a warning says what
    was dropped. QR-DQN's optimizer had the same layout."""
    from sb3_contrib import QRDQN

    old = _pre_24_dqn_zip(tmp_path / "old.zip", DQN if plastic_cls is PlasticDQN else QRDQN)
    online = {n: p for n, p in old.policy.named_parameters() if "target" not in n}
    plastic = plastic_cls("MlpPolicy", "CartPole-v1", buffer_size=1000, learning_starts=16, train_freq=4, seed=1,
                          policy_kwargs=dict(net_arch=[16]))
    coefs = [g["isometry_coef"] for g in plastic.policy.optimizer.param_groups]
    with pytest.warns(UserWarning, match="SB3 < 2.4.0.*target network"):
        plastic.set_parameters(str(tmp_path / "old.zip"))
    optimizer = plastic.policy.optimizer
    assert [g["isometry_coef"] for g in optimizer.param_groups] == coefs and coefs[0] > 0
    names = {id(p): n for n, p in plastic.policy.named_parameters()}
    checked = 0
    for group in optimizer.param_groups:
        assert group["lr"] == old.policy.optimizer.param_groups[0]["lr"] and group["eps"] == 1e-8
        for p in group["params"]:
            reference = old.policy.optimizer.state[online[names[id(p)]]]
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert th.equal(optimizer.state[p][key], reference[key]), (names[id(p)], key)
            checked += 1
    assert checked == len(online)
    plastic.learn(32)


def test_sb3s_no_target_params_test_with_the_plastic_defaults(tmp_path):
    """SB3's ``test_save_load_no_target_params`` with PlasticDQN at the library defaults (AdamO): a plastic model
    whose optimizer is replaced by one Adam group over all its parameters loads with a warning and trains."""
    _pre_24_dqn_zip(tmp_path / "test_save.zip", PlasticDQN)
    with pytest.warns(UserWarning, match="SB3 < 2.4.0"):
        PlasticDQN.load(str(tmp_path / "test_save.zip"), env=gym.make("CartPole-v1")).learn(20)
