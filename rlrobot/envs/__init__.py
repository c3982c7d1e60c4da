from .registry import make, native_task_ids, validate_task_id
from .vec_env import VecEnv, check_action

__all__ = ["VecEnv", "check_action", "make", "native_task_ids", "validate_task_id"]
