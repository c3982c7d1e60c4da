from .ppo import PPO, PPOConfig
from .sac import SAC, SACConfig

ALGORITHMS = ("ppo", "sac")

__all__ = ["ALGORITHMS", "PPO", "PPOConfig", "SAC", "SACConfig"]
