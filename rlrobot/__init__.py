"""rlrobot: robot learning from massively parallel simulation to the real arm."""

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported
# torch's OpenMP threads sleep at a barrier instead of spinning (read when torch loads, so before any torch import).
# With spinning, a 2-thread PPO update on a loaded 2-core machine took 214-673 ms per minibatch against 3.4-4.3 ms
# passive (64x64 MLPs, minibatch 64): each op's barrier waited for a descheduled spinner. Numerics are unchanged.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__all__ = ["VecEnv", "make"]
__version__ = "0.2.0"


def __getattr__(name: str):
    """``rlrobot.make`` and ``rlrobot.VecEnv`` load torch and the simulators on first use, not on ``import rlrobot``
    (so that ``rlrobot --help`` answers at once)."""
    if name == "make":
        from rlrobot.tasks.registry import make

        return make
    if name == "VecEnv":
        from rlrobot.envs.vec_env import VecEnv

        return VecEnv
    raise AttributeError(f"module 'rlrobot' has no attribute {name!r}")
