from .rollout_storage import RolloutStorage

__all__ = ["RolloutStorage"]
