"""Feature extractors with a selectable activation ("relu" | "maxmin" | "tanh").

* :class:`PlasticCNN`: the Nature-DQN CNN (Mnih et al., 2015; SB3's ``NatureCNN`` layer for layer)
  for Atari-sized images, or the MinAtar CNN (Young & Tian, 2019: one 3x3 conv with 16 channels and a
  128-unit layer) for 10x10 observations, chosen by ``arch`` ("auto" picks by image size).
* :class:`PlasticMLP`: an MLP feature extractor.
* :class:`PlasticCombinedExtractor`: SB3's ``CombinedExtractor`` with :class:`PlasticCNN` for images.

With ``activation="relu"`` and ``arch="nature"`` the CNN creates the same layers in the same order as
SB3's ``NatureCNN``, so a seeded run is identical.
"""

from __future__ import annotations

import warnings
from typing import Optional, Union

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_flattened_obs_dim, is_image_space
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn

from sb3_plastic.activations import MaxMin, doubles_width, get_activation

CNN_ARCHS = ("auto", "nature", "minatar")
#: "auto" picks the Nature CNN when both spatial sizes are at least this large (its 8x8/4, 4x4/2, 3x3/1
#: stack needs 36 pixels), the MinAtar CNN otherwise.
NATURE_MIN_SIZE = 36


class ImageSpaceError(ValueError, AssertionError):
    """An observation space a CNN extractor does not take. SB3's ``NatureCNN`` asserts in the same place, so this
    error is both a ``ValueError`` and an ``AssertionError`` (code written for SB3 keeps catching it)."""


def is_binary_frame_space(space: gym.Space) -> bool:
    """Whether ``space`` is a 3-D boolean ``Box``: MinAtar's ``(10, 10, C)`` frames (Young & Tian, 2019) and
    the boolean CHIP-8 screens of Octax, which :class:`PlasticCNN` takes on purpose (SB3's ``NatureCNN`` does not)."""
    return isinstance(space, spaces.Box) and len(space.shape) == 3 and space.dtype == np.bool_


def infer_channels_last(space: spaces.Box) -> bool:
    """Whether a non-uint8 3-D ``Box`` holds ``(H, W, C)`` frames, for :class:`PlasticCNN` ``channels_last=None``.

    Boolean frames (:func:`is_binary_frame_space`) whose first two sizes are equal are MinAtar's ``(10, 10, C)``:
    channels-last, whatever ``C`` is. Otherwise the smallest size is the channel axis, as SB3's
    ``is_image_space_channels_first`` reads it (Octax's ``(frame_skip, 32, 64)`` is channels-first). SB3's rule alone
    would read Seaquest's and ``SwitchingMinAtar``'s ``(10, 10, 10)`` as ``(C, H, W)`` (a tie goes to the first axis)
    and convolve over image rows. A box whose smallest size is shared by its first and last axes is ambiguous: it is
    read as ``(C, H, W)``, with a warning that asks for ``channels_last``.
    """
    shape = space.shape
    if is_binary_frame_space(space) and shape[0] == shape[1]:
        return True
    smallest = min(shape)
    if shape[0] == smallest and shape[2] == smallest:
        warnings.warn(f"PlasticCNN: the observation shape {shape} reads as (C, H, W) or as (H, W, C); taking (C, H, W). "
                      "Say which with policy_kwargs=dict(features_extractor_kwargs=dict(channels_last=...)).",
                      stacklevel=3)
        return False
    return int(np.argmin(shape)) == 2


def check_cnn_space(observation_space: gym.Space, normalized_image: bool) -> None:
    """SB3's ``NatureCNN`` guard, with the library's boolean frames (:func:`is_binary_frame_space`) allowed.

    :raises ImageSpaceError: for anything else that SB3's ``is_image_space(..., check_channels=False,
        normalized_image=normalized_image)`` rejects (a float / unbounded box, e.g. after ``VecNormalize``).
    """
    if is_binary_frame_space(observation_space):
        return
    if not is_image_space(observation_space, check_channels=False, normalized_image=normalized_image):
        raise ImageSpaceError(
            f"PlasticCNN (as SB3's NatureCNN) takes images: a 3-D uint8 Box with bounds [0, 255], or with "
            f"normalize_images=False any 3-D Box; boolean frames (MinAtar's (10, 10, C), dtype=bool) are also "
            f"allowed. Got {observation_space}. Use 'MlpPolicy' / 'MultiInputPolicy' for non-image observations; "
            f"for images that are already normalised (VecNormalize, float channel-first frames) pass "
            f"policy_kwargs=dict(normalize_images=False)."
        )


def check_even_widths(activation: type[nn.Module], widths: dict[str, int]) -> None:
    """MaxMin pairs features and CReLU / Fourier features produce two per unit, so every width they act on must be
    even: fail early with the culprit."""
    if activation is MaxMin or doubles_width(activation):
        odd = {name: width for name, width in widths.items() if width % 2}
        if odd:
            name = "maxmin" if activation is MaxMin else activation.__name__.lower()
            raise ValueError(f"activation={name!r} needs even layer widths, got odd {odd}")


@th.no_grad()
def halve_for_doubling_(module: nn.Module) -> dict[nn.Parameter, nn.Parameter]:
    """Give every Linear / Conv2d that is followed, in its ``nn.Sequential``, by a width-doubling activation
    (:func:`~sb3_plastic.activations.doubles_width`: CReLU, Fourier) half of its output units, in place: a layer built
    for width ``w`` keeps its first ``w / 2`` output rows (and biases), and the activation turns them back into ``w``
    features, so the readers of the layer keep their input width. The kept rows are a sample of the same initialiser
    (PyTorch's default: the same distribution, the fan-in being unchanged; SB3's orthogonal init: orthonormal rows of a
    wide layer stay orthonormal).

    This is how CReLU networks are kept comparable to ReLU networks (Abbas et al., 2023 halve the units of the CReLU
    layers so that the networks keep their size): the same input / output widths everywhere, half the hidden units, and
    for a hidden layer reading ``n`` features into ``w`` outputs ``n * w / 2`` weights instead of ``n * w``: PPO's
    ``[64, 64]`` policy and value MLPs on CartPole have 9 155 parameters with ReLU and 4 675 with CReLU or Fourier
    features (the heads read the same 64 features in both). Plasticine keeps every layer's units and doubles its
    readers' inputs instead (more parameters than ReLU).

    :return: ``old parameter -> new parameter`` (the caller maps optimizers and target networks).
    """
    mapping: dict[nn.Parameter, nn.Parameter] = {}
    for parent in module.modules():
        if not isinstance(parent, nn.Sequential):
            continue
        children = list(parent)
        for index, layer in enumerate(children[:-1]):
            following = children[index + 1]
            if isinstance(following, nn.LayerNorm):  # NaP's norm between the layer and its activation
                following = children[index + 2] if index + 2 < len(children) else None
            if not isinstance(layer, (nn.Linear, nn.Conv2d)) or not doubles_width(following):
                continue
            if getattr(layer, "_plastic_halved", False):  # built with half its units already (PlasticCNN, PlasticMLP)
                continue
            width = layer.weight.shape[0]
            if width % 2:
                raise ValueError(f"{type(following).__name__} needs an even width, {type(layer).__name__} has {width}")
            half = width // 2
            old_weight, old_bias = layer.weight, layer.bias
            layer.weight = nn.Parameter(old_weight[:half].clone())
            mapping[old_weight] = layer.weight
            if old_bias is not None:
                layer.bias = nn.Parameter(old_bias[:half].clone())
                mapping[old_bias] = layer.bias
            if isinstance(layer, nn.Linear):
                layer.out_features = half
            else:
                layer.out_channels = half
            layer._plastic_halved = True
    return mapping


def _units(width: int, activation: type[nn.Module]) -> int:
    """The units a layer of ``width`` output features has before ``activation``: half of them for a width-doubling
    activation (:func:`halve_for_doubling_`)."""
    return width // 2 if doubles_width(activation) else width


def _layer(layer: nn.Module, activation: type[nn.Module]) -> nn.Module:
    """Mark a layer built with :func:`_units` (so :func:`halve_for_doubling_` leaves it alone)."""
    if doubles_width(activation):
        layer._plastic_halved = True
    return layer


class PlasticCNN(BaseFeaturesExtractor):
    """CNN feature extractor for image-like ``Box`` observations, with a selectable activation.

    :param observation_space: a 3-D ``Box``; channels-first, or channels-last for non-image boxes
        such as MinAtar's ``(10, 10, C)`` booleans (then the extractor moves the channels first itself;
        SB3 already transposes channels-last uint8 images with ``VecTransposeImage``).
    :param features_dim: width of the last (linear) layer; default 512 (Nature) or 128 (MinAtar).
    :param activation: "relu" | "maxmin" | "tanh" or an ``nn.Module`` class (the plastic policies pass ReLU,
        ``NatureCNN``'s, unless ``activation`` names another).
    :param arch: "nature", "minatar" or "auto" (Nature when H and W >= 36).
    :param normalized_image: as in SB3's ``NatureCNN``: the observations are already normalised, so any 3-D
        ``Box`` is taken (SB3 sets it from ``normalize_images=False``). Without it the space must be an image
        (uint8, [0, 255]) or boolean frames; anything else raises :class:`ImageSpaceError` where SB3 asserts.
    :param channels_last: the layout of a non-uint8 box: ``True`` for ``(H, W, C)``, ``False`` for ``(C, H, W)``,
        ``None`` (default) to infer it (:func:`infer_channels_last`). uint8 images always arrive channels-first
        (SB3's ``VecTransposeImage``), so only ``None`` or ``False`` is accepted for them.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        features_dim: Union[int, None] = None,
        activation: Union[str, type[nn.Module]] = "relu",
        arch: str = "auto",
        normalized_image: bool = False,
        channels_last: Optional[bool] = None,
    ) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 3:
            raise ImageSpaceError(f"PlasticCNN needs a 3-D Box observation space (C, H, W), got {observation_space}")
        check_cnn_space(observation_space, normalized_image)
        if arch not in CNN_ARCHS:
            raise ValueError(f"Unknown arch {arch!r} for PlasticCNN; allowed: {list(CNN_ARCHS)}")
        act = get_activation(activation)
        shape = observation_space.shape
        # uint8 images reach the extractor channels-first (SB3 wraps the env in VecTransposeImage);
        # other boxes (MinAtar's (10, 10, C) booleans) are moved channels-first here when needed.
        if is_image_space(observation_space, check_channels=False):
            if channels_last:
                raise ValueError(f"channels_last=True for the uint8 image space {observation_space}: SB3 transposes "
                                 "channels-last images itself (VecTransposeImage); leave channels_last=None")
            self.channels_last = False
        elif channels_last is None:
            self.channels_last = infer_channels_last(observation_space)
        elif isinstance(channels_last, (bool, np.bool_)):
            self.channels_last = bool(channels_last)
        else:
            raise ValueError(f"channels_last must be None, True or False, got {channels_last!r}")
        chw = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        if arch == "auto":
            arch = "nature" if min(chw[1], chw[2]) >= NATURE_MIN_SIZE else "minatar"
        self.arch = arch
        if features_dim is None:
            features_dim = 512 if arch == "nature" else 128
        super().__init__(observation_space, features_dim)
        n_in = chw[0]
        if arch == "nature":
            check_even_widths(act, {"conv1": 32, "conv2": 64, "conv3": 64, "features_dim": features_dim})
            self.cnn = nn.Sequential(
                _layer(nn.Conv2d(n_in, _units(32, act), kernel_size=8, stride=4, padding=0), act),
                act(),
                _layer(nn.Conv2d(32, _units(64, act), kernel_size=4, stride=2, padding=0), act),
                act(),
                _layer(nn.Conv2d(64, _units(64, act), kernel_size=3, stride=1, padding=0), act),
                act(),
                nn.Flatten(),
            )
        else:
            check_even_widths(act, {"conv1": 16, "features_dim": features_dim})
            conv = _layer(nn.Conv2d(n_in, _units(16, act), kernel_size=3, stride=1, padding=0), act)
            self.cnn = nn.Sequential(conv, act(), nn.Flatten())
        with th.no_grad():
            sample = th.as_tensor(observation_space.sample()[None]).float()
            try:
                n_flatten = self.cnn(self._channels_first(sample)).shape[1]
            except RuntimeError as exc:
                raise ValueError(
                    f"observation of shape {shape} (channels-first {tuple(chw)}) is too small for arch={arch!r}; "
                    f"the Nature CNN needs H, W >= {NATURE_MIN_SIZE}, the MinAtar CNN H, W >= 3"
                ) from exc
        self.linear = nn.Sequential(_layer(nn.Linear(n_flatten, _units(features_dim, act)), act), act())

    def _channels_first(self, x: th.Tensor) -> th.Tensor:
        return x.permute(0, 3, 1, 2) if self.channels_last else x

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.linear(self.cnn(self._channels_first(observations)))


class PlasticMLP(BaseFeaturesExtractor):
    """MLP feature extractor: flatten, then ``Linear -> activation`` for each width of ``net_arch``.

    :param observation_space: any space SB3 can flatten.
    :param net_arch: hidden widths; the last one is ``features_dim``.
    :param activation: "relu" | "maxmin" | "tanh" or an ``nn.Module`` class.
    """

    def __init__(
        self,
        observation_space: gym.Space,
        net_arch: tuple[int, ...] = (256, 256),
        activation: Union[str, type[nn.Module]] = "relu",
    ) -> None:
        if len(net_arch) == 0 or any(int(w) <= 0 for w in net_arch):
            raise ValueError(f"net_arch must be a non-empty list of positive widths, got {list(net_arch)}")
        act = get_activation(activation)
        check_even_widths(act, {f"layer{i}": int(w) for i, w in enumerate(net_arch)})
        super().__init__(observation_space, int(net_arch[-1]))
        layers: list[nn.Module] = [nn.Flatten()]
        width = get_flattened_obs_dim(observation_space)
        for w in net_arch:
            layers += [_layer(nn.Linear(width, _units(int(w), act)), act), act()]
            width = int(w)
        self.mlp = nn.Sequential(*layers)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.mlp(observations.float())


class PlasticCombinedExtractor(BaseFeaturesExtractor):
    """SB3's ``CombinedExtractor`` with :class:`PlasticCNN` for image keys and flattening for the rest.

    :param observation_space: a ``Dict`` space.
    :param cnn_output_dim: features per image key.
    :param normalized_image: as in SB3.
    :param activation: activation of the CNNs.
    """

    def __init__(
        self,
        observation_space: spaces.Dict,
        cnn_output_dim: int = 256,
        normalized_image: bool = False,
        activation: Union[str, type[nn.Module]] = "relu",
    ) -> None:
        super().__init__(observation_space, features_dim=1)
        extractors: dict[str, nn.Module] = {}
        total = 0
        for key, subspace in observation_space.spaces.items():
            if is_image_space(subspace, normalized_image=normalized_image):
                extractors[key] = PlasticCNN(
                    subspace,
                    features_dim=cnn_output_dim,
                    activation=activation,
                    arch="auto",
                    normalized_image=normalized_image,
                )
                total += cnn_output_dim
            else:
                extractors[key] = nn.Flatten()
                total += get_flattened_obs_dim(subspace)
        self.extractors = nn.ModuleDict(extractors)
        self._features_dim = total

    def forward(self, observations: dict[str, th.Tensor]) -> th.Tensor:
        return th.cat([extractor(observations[key]) for key, extractor in self.extractors.items()], dim=1)
