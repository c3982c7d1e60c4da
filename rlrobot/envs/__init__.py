from .vec_env import VecEnv, check_action

__all__ = ["VecEnv", "check_action"]
