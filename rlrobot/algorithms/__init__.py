from .ppo import PPO, PPOConfig

ALGORITHMS = ("ppo",)

__all__ = ["ALGORITHMS", "PPO", "PPOConfig"]
