"""rlrobot: robot learning from massively parallel simulation to the real arm."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported

from rlrobot.envs import VecEnv, make  # noqa: E402

__all__ = ["VecEnv", "make"]
__version__ = "0.1.0"
