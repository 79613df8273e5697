"""Plasticity interventions as SB3 callbacks.

They work on PPO, A2C, DQN, SAC, TD3, DDPG and sb3-contrib's QR-DQN, TQC, CrossQ, RecurrentPPO and MaskablePPO,
plain or plastic (the networks are found by :func:`sb3_plastic.common.surgery.find_networks`):

* :class:`LayerReset`: re-initialise the last layers / the heads periodically or at task changes (Nikishin et al.,
  2022).
* :class:`ChurnReduction`: C-CHAIN, keep the outputs on other data close to the previous update's (Tang et al., 2025).
* :class:`PlasticityInjection`: freeze the head, add a new one minus its frozen copy (Nikishin et al., 2023).
* :class:`ParsevalRegularisation`: keep every hidden weight matrix a Parseval frame (Chung et al., 2024).
* :class:`WeightClipping`: clamp every weight to a multiple of its initialisation bound after each step (Elsayed et al.,
  2024).
* :class:`FIRE`: replace every weight by its polar factor (exact, by SVD; ``iterations=10`` gives the reference's
  Newton–Schulz) at a midpoint / every N steps / task switch.
* :class:`ContinualBackprop`: generate-and-test replacement of low-utility hidden units.
* :class:`ReDo`: recycle dormant units.
* :class:`ShrinkPerturb`: shrink and perturb the weights, at events or continually.
* :class:`L2Init`: L2 regularisation towards the initial parameters (Kumar et al., 2023).
* :class:`SpectralRegularisation`: pull each layer's largest singular value towards 1 (Lewandowski et al., 2024).
* :class:`NormalizeAndProject`: Normalize-and-Project's weight projection (Lyle et al., 2024).
* :class:`PlasticityMonitor`: plasticity diagnostics (dormant units, ranks, DfI, NTK conditioning) in TensorBoard.
* :class:`ContinualEvalCallback`: SB3's ``EvalCallback`` evaluating the task being trained on a continual env.
* :class:`TaskScheduleSync`: the task schedule of a piecewise-stationary env follows the model's ``num_timesteps``
  (resuming continues the task sequence); added by the plastic algorithms, pass it yourself to plain SB3 models.

Each has a config dataclass whose fields are the top-level keywords of the plastic algorithms.
"""

from sb3_plastic.callbacks.base import PlasticCallback
from sb3_plastic.callbacks.cbp import ContinualBackprop, ContinualBackpropConfig, GenerateAndTest
from sb3_plastic.callbacks.churn_reduction import ChurnReduction, ChurnReductionConfig
from sb3_plastic.callbacks.continual_eval import ContinualEvalCallback, continual_eval_callback_class
from sb3_plastic.callbacks.fire import FIRE, FIREConfig, fire_, newton_schulz_polar
from sb3_plastic.callbacks.layer_reset import LayerReset, LayerResetConfig
from sb3_plastic.callbacks.monitor import PlasticityMonitor
from sb3_plastic.callbacks.nap import NaPConfig, NormalizeAndProject, insert_layer_norms_
from sb3_plastic.callbacks.parseval import ParsevalConfig, ParsevalRegularisation
from sb3_plastic.callbacks.plasticity_injection import PlasticityInjection, PlasticityInjectionConfig, load_injected
from sb3_plastic.callbacks.redo import ReDo, ReDoConfig, dormant_units
from sb3_plastic.callbacks.regularisers import (
    L2Init,
    L2InitConfig,
    SpectralRegularisation,
    SpectralRegularisationConfig,
)
from sb3_plastic.callbacks.schedule import TaskScheduleSync
from sb3_plastic.callbacks.shrink_perturb import ShrinkPerturb, ShrinkPerturbConfig
from sb3_plastic.callbacks.weight_clipping import WeightClipping, WeightClippingConfig

__all__ = [
    "FIRE",
    "ChurnReduction",
    "ChurnReductionConfig",
    "ContinualBackprop",
    "ContinualBackpropConfig",
    "ContinualEvalCallback",
    "FIREConfig",
    "GenerateAndTest",
    "L2Init",
    "L2InitConfig",
    "LayerReset",
    "LayerResetConfig",
    "NaPConfig",
    "NormalizeAndProject",
    "ParsevalConfig",
    "ParsevalRegularisation",
    "PlasticCallback",
    "PlasticityInjection",
    "PlasticityInjectionConfig",
    "PlasticityMonitor",
    "ReDo",
    "ReDoConfig",
    "ShrinkPerturb",
    "ShrinkPerturbConfig",
    "SpectralRegularisation",
    "SpectralRegularisationConfig",
    "TaskScheduleSync",
    "WeightClipping",
    "WeightClippingConfig",
    "continual_eval_callback_class",
    "dormant_units",
    "fire_",
    "insert_layer_norms_",
    "load_injected",
    "newton_schulz_polar",
]
