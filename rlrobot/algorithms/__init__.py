"""Learning algorithms, one module each; every module registers an ``AlgorithmSpec`` (``registry.py``) on import.
Adding an algorithm: a new module here, its import below, a preset in ``configs/`` and tests."""

from . import awac, bc, cal_ql, edp, fdvl, flow_nft, flow_ppo, flow_srpo, fql, iql, ppo, recoil, rql, sac, sft  # noqa: F401  (register the built-in algorithms)
from .flow_ppo import FlowPPO, FlowPPOConfig, InitCheckpoint
from .ppo import PPO, PPOConfig
from .registry import AlgorithmConfig, AlgorithmSpec, algorithm_names, algorithm_spec, register_algorithm
from .sac import SAC, SACConfig
from .sft import DatasetInput, FlowSFT, SFTConfig

__all__ = ["PPO", "SAC", "AlgorithmConfig", "AlgorithmSpec", "DatasetInput", "FlowPPO", "FlowPPOConfig",
           "FlowSFT", "InitCheckpoint", "PPOConfig", "SACConfig", "SFTConfig", "algorithm_names", "algorithm_spec",
           "register_algorithm"]

# the LeRobot VLA algorithms (vla-sft, vla-flow-noise, vla-flow-sde; vla-token-ppo), which build on flow_ppo and sft
# warm starts (wsrl, rlpd, cal-ql-online) and the progress models (prm, sarm)
from . import progress_model, sarm, token_ppo, vla, wsrl  # noqa: E402, F401
