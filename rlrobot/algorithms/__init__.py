from .flow_ppo import FLOW_VARIANTS, FlowPPO, FlowPPOConfig
from .ppo import PPO, PPOConfig
from .sac import SAC, SACConfig
from .sft import FlowSFT, SFTConfig

ALGORITHMS = ("ppo", "sac", "sft", "flow-noise", "flow-sde")
FLOW_ALGORITHMS = ("sft", "flow-noise", "flow-sde")  # these train the flow-matching action-chunk policy

__all__ = ["ALGORITHMS", "FLOW_ALGORITHMS", "FLOW_VARIANTS", "PPO", "PPOConfig", "SAC", "SACConfig", "FlowPPO",
           "FlowPPOConfig", "FlowSFT", "SFTConfig"]
