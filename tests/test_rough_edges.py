"""Issue #12's rough edges: make_atari_env on SwitchingAtari, gym.make without importing sb3_plastic.envs, and
the plastic / intervention keywords in help(PlasticPPO) and the other plastic algorithms."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pydoc
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import sb3_plastic
import sb3_plastic.envs  # registers the sb3_plastic/ ids
from sb3_plastic.callbacks.cbp import ContinualBackpropConfig
from sb3_plastic.callbacks.fire import FIREConfig
from sb3_plastic.callbacks.redo import ReDoConfig
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturbConfig
from sb3_plastic.common.plastic_algorithm import PlasticAlgorithmMixin
from sb3_plastic.config import IsometryConfig

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- 1. make_atari_env on SwitchingAtari
def _need_atari() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")


def test_make_atari_env_on_switching_atari_says_it_is_preprocessed():
    _need_atari()
    from stable_baselines3.common.env_util import make_atari_env

    with pytest.raises(AttributeError, match="already does the Atari preprocessing") as info:
        make_atari_env("sb3_plastic/SwitchingAtari-v0", n_envs=1, seed=0, env_kwargs={"games": ["Pong"]})
    message = str(info.value)
    assert "make_vec_env('sb3_plastic/SwitchingAtari-v0'" in message
    assert "'get_action_meanings'" in message


def test_gymnasium_atari_preprocessing_on_switching_atari_says_it_is_preprocessed():
    _need_atari()
    env = gym.make("sb3_plastic/SwitchingAtari-v0", games=["Pong"])
    try:
        with pytest.raises(AttributeError, match="already does the Atari preprocessing"):
            gym.wrappers.AtariPreprocessing(env, frame_skip=1)
        with pytest.raises(AttributeError, match="already does the Atari preprocessing"):
            env.unwrapped.ale  # noqa: B018
        # other missing attributes keep Python's plain message; hasattr stays False for the raw-ALE ones
        with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
            env.unwrapped.no_such_thing  # noqa: B018
        assert not hasattr(env.unwrapped, "get_action_meanings")
        # the route the message gives to the game's own ALE env
        meanings = env.unwrapped.current.unwrapped.get_action_meanings()
        assert len(meanings) == 18 and meanings[0] == "NOOP"
    finally:
        env.close()


def test_switching_atari_through_make_vec_env_with_reward_clipping():
    _need_atari()
    from stable_baselines3.common.atari_wrappers import ClipRewardEnv
    from stable_baselines3.common.env_util import make_vec_env

    from sb3_plastic.envs.atari_envs import PreprocessedAtariGames, SwitchingAtariEnv
    from sb3_plastic.envs.wrappers import GameSwitchingEnv

    vec = make_vec_env(
        "sb3_plastic/SwitchingAtari-v0", n_envs=1, seed=0, env_kwargs={"games": ["Pong"]}, wrapper_class=ClipRewardEnv
    )
    try:
        obs = vec.reset()
        assert obs.shape == (1, 4, 84, 84) and obs.dtype == np.uint8
        obs, reward, _, infos = vec.step(np.array([0]))
        assert obs.shape == (1, 4, 84, 84) and set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        assert infos[0]["game"] == "Pong" and infos[0]["task_id"] == 0
        inner = vec.envs[0].unwrapped
        assert isinstance(inner, PreprocessedAtariGames)
        switching = vec.envs[0].env.env
        while not isinstance(switching, GameSwitchingEnv):
            switching = switching.env
        assert isinstance(switching, SwitchingAtariEnv)
    finally:
        vec.close()


# --------------------------------------------------------------------------- 2. gym.make without the import
def _headline_snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)


def test_readme_headline_makes_its_env_with_a_spelling_that_needs_no_import():
    snippet = _headline_snippet()
    made = re.findall(r'gym\.make\("([^"]+)"', snippet)
    assert made, "the headline snippet must show how to make a sb3_plastic env"
    for env_id in made:
        assert env_id.startswith("sb3_plastic.envs:sb3_plastic/"), env_id


def test_module_prefixed_id_works_in_a_fresh_interpreter():
    env_id = re.findall(r'gym\.make\("([^"]+)"', _headline_snippet())[0].replace("SwitchingMinAtar", "RandomLabelBandit")
    code = textwrap.dedent(
        f"""
        import json, sys
        import gymnasium as gym
        from stable_baselines3.common.env_util import make_vec_env
        before = sorted(m for m in sys.modules if m.startswith("sb3_plastic"))
        env = gym.make({env_id!r})
        env.reset(seed=0)
        vec = make_vec_env({env_id!r}, n_envs=2, seed=0)
        print(json.dumps({{"before": before, "spec": env.spec.id, "vec_obs": list(vec.reset().shape),
                           "plain": "sb3_plastic/RandomLabelBandit-v0" in gym.registry}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT / "tests")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["before"] == []  # nothing of sb3_plastic was imported before gym.make
    assert result["spec"] == "sb3_plastic/RandomLabelBandit-v0"
    assert result["vec_obs"][0] == 2
    assert result["plain"]  # from then on the plain id works too


# --------------------------------------------------------------------------- 3. keywords in help(PlasticXXX)
ALGORITHMS = [
    "PlasticPPO",
    "PlasticDQN",
    "PlasticSAC",
    "PlasticQRDQN",
    "PlasticTQC",
    "PlasticCrossQ",
    "PlasticRecurrentPPO",
    "PlasticMaskablePPO",
]
CONFIGS = [IsometryConfig, FIREConfig, ContinualBackpropConfig, ReDoConfig, ShrinkPerturbConfig]


def _first_lines(config_cls: type) -> dict[str, str]:
    """name -> first line of its ``:param`` text in the config docstring (parsed here, independently of the library)."""
    found = {}
    for line in inspect.cleandoc(config_cls.__doc__).splitlines():
        match = re.match(r":param (\w+): (.*)", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def _flat(text: str) -> str:
    lines = [re.sub(r"^\s*\|\s?", "", line) for line in text.splitlines()]
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize("config_cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_config_field_is_documented_in_its_config(config_cls):
    documented = _first_lines(config_cls)
    missing = [f.name for f in dataclasses.fields(config_cls) if f.name not in documented]
    assert not missing, f"{config_cls.__name__}: fields without a ':param name:' line: {missing}"


@pytest.mark.parametrize("name", ALGORITHMS)
def test_help_lists_every_plastic_and_intervention_keyword(name):
    cls = getattr(sb3_plastic, name)
    doc = _flat(pydoc.render_doc(cls, renderer=pydoc.plaintext))
    # what a keyword left out gives: the isometry keywords' defaults are those of the mixin's signature
    signature = inspect.signature(PlasticAlgorithmMixin.__init__).parameters
    for config_cls in CONFIGS:
        first_lines = _first_lines(config_cls)
        for field in dataclasses.fields(config_cls):
            text = " ".join(first_lines[field.name].split())
            assert f":param {field.name}: {text}" in doc, f"{name}: {field.name} ({config_cls.__name__}) not in help()"
            default = signature[field.name].default if field.name in signature else field.default
            if field.name == "isometry_coef":  # None in the signature: the class's family default
                default = cls.default_isometry_coef
            entry = doc.split(f":param {field.name}: {text}", 1)[1].split(":param ", 1)[0]
            assert f"Default: ``{default!r}``" in entry, f"{name}: default of {field.name} not in help()"


def test_keyword_section_is_added_once_and_to_subclasses():
    from sb3_plastic.common.docs import SECTION_MARKER

    class Documented(sb3_plastic.PlasticPPO):
        """A user's PPO."""

    class Undocumented(sb3_plastic.PlasticPPO):
        pass

    assert sb3_plastic.PlasticPPO.__doc__.count(SECTION_MARKER) == 1
    assert Documented.__doc__.count(SECTION_MARKER) == 1 and "replacement_rate" in Documented.__doc__
    assert Undocumented.__doc__ is None and inspect.getdoc(Undocumented).count(SECTION_MARKER) == 1


def test_param_docs_reads_continuation_lines_that_start_with_a_role():
    from sb3_plastic.common.docs import config_param_docs, param_docs

    doc = """Settings.

    :param alpha: first line
        :func:`f` of the batch size,
        last line.
    :param beta: one line.

    Closing paragraph, not part of beta.
    """
    assert param_docs(doc) == {"alpha": "first line :func:`f` of the batch size, last line.", "beta": "one line."}

    @dataclasses.dataclass
    class Config:
        """:param alpha: documented."""

        alpha: int = 1
        gamma: float = 0.5

    entries = config_param_docs(Config, {"alpha": "auto"})
    assert entries[0] == ("alpha", "documented.", "auto")
    assert entries[1][0] == "gamma" and "not documented" in entries[1][1] and entries[1][2] == 0.5
    with pytest.raises(TypeError, match="dataclass"):
        config_param_docs(int)
