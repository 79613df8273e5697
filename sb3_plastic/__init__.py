"""sb3-plastic: Stable-Baselines3 agents that keep their ability to learn when the world changes."""

from sb3_plastic.activations import MaxMin, get_activation
from sb3_plastic.callbacks import (
    FIRE,
    ChurnReduction,
    ContinualBackprop,
    ContinualEvalCallback,
    L2Init,
    LayerReset,
    NormalizeAndProject,
    ParsevalRegularisation,
    PlasticityInjection,
    PlasticityMonitor,
    ReDo,
    ShrinkPerturb,
    SpectralRegularisation,
    TaskScheduleSync,
    WeightClipping,
)
from sb3_plastic.config import IsometryConfig
from sb3_plastic.crossq import PlasticCrossQ
from sb3_plastic.dqn import PlasticDQN
from sb3_plastic.isometry import dfi_per_layer, isometry_penalty, isometry_penalty_grad
from sb3_plastic.maskable_ppo import PlasticMaskablePPO
from sb3_plastic.networks import PlasticCNN, PlasticCombinedExtractor, PlasticMLP
from sb3_plastic.optim import AdamO, reset_optimizer_state
from sb3_plastic.ppo import PlasticPPO
from sb3_plastic.qrdqn import PlasticQRDQN
from sb3_plastic.recurrent_ppo import PlasticRecurrentPPO
from sb3_plastic.sac import PlasticSAC
from sb3_plastic.tqc import PlasticTQC

__version__ = "0.1.0"

__all__ = [
    "FIRE",
    "AdamO",
    "ChurnReduction",
    "ContinualBackprop",
    "ContinualEvalCallback",
    "IsometryConfig",
    "L2Init",
    "LayerReset",
    "MaxMin",
    "NormalizeAndProject",
    "ParsevalRegularisation",
    "PlasticCNN",
    "PlasticCombinedExtractor",
    "PlasticCrossQ",
    "PlasticDQN",
    "PlasticMLP",
    "PlasticMaskablePPO",
    "PlasticPPO",
    "PlasticQRDQN",
    "PlasticRecurrentPPO",
    "PlasticSAC",
    "PlasticTQC",
    "PlasticityInjection",
    "PlasticityMonitor",
    "ReDo",
    "ShrinkPerturb",
    "SpectralRegularisation",
    "TaskScheduleSync",
    "WeightClipping",
    "dfi_per_layer",
    "get_activation",
    "isometry_penalty",
    "isometry_penalty_grad",
    "reset_optimizer_state",
]
