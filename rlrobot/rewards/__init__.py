"""Reward wrappers: the one slot through which shaping, exploration bonuses and learned (process) reward models reach
training. One module per reward kind; each registers a ``RewardSpec`` (``registry.py``) on import.

A reward wrapper is a VecEnv that wraps another, replaces or adds to its reward, and keeps ``info["final_obs"]``,
``info["episode"]`` (its ``return`` becomes the wrapped return; ``task_return`` keeps the task's) and
``info["success"]`` consistent. ``rlrobot.make(..., reward_wrappers=[...])`` applies factories (env -> wrapped env)
in order; ``RewardConfig`` (``--reward.*``) builds them for a run.

Adding a kind: a module here that registers its spec (with its settings section, if any) and its import below.
"""

from rlrobot.rewards import dense_potential, disagreement, progress_reward, srpo  # noqa: F401  (the built-in kinds)
from rlrobot.rewards.config import RewardConfig  # made from the kinds registered above
from rlrobot.rewards.discount import ChunkDiscount, set_steps_per_discount
from rlrobot.rewards.registry import RewardFactory, RewardSpec, register_reward, reward_names

__all__ = ["ChunkDiscount", "RewardConfig", "RewardFactory", "RewardSpec", "register_reward", "reward_names",
           "set_steps_per_discount"]
