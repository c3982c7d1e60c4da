"""A task of your own: a reach variant with targets just above the table and a tighter success radius, registered
in the task registry, checked with its scripted expert, then trained with PPO through the normal CLI path.

    python examples/custom_task.py [--total-steps 300000] [--smoke]

Deriving from an SO-101 task keeps the arm, the three control modes, IK, cameras and the expert, so a new goal is a
few lines. To make it a permanent part of rlrobot (``rlrobot train --task so101-reach-low`` in any shell), put the
class and the ``register_task`` call in a module under ``tasks/`` and import it in ``tasks/__init__.py``.
"""

from __future__ import annotations

import argparse

import numpy as np

import rlrobot
from rlrobot.cli import main as rlrobot_cli
from rlrobot.tasks.mujoco_vec_env import OBS_MODES, REWARD_MODES
from rlrobot.tasks.registry import TaskSpec, register_task
from rlrobot.tasks.so101 import CONTROL_MODES, SO101Reach


class SO101ReachLow(SO101Reach):
    """Bring the TCP to a target just above the table (2-5 cm up), within 1.5 cm."""

    task_name = "so101-reach-low"
    default_max_episode_steps = 60
    success_threshold = 0.015  # metres (so101-reach: 0.02)

    @property
    def instruction(self) -> list[str]:
        return ["lower the gripper to the green marker"] * self.num_envs

    def _reset_task(self, ids: np.ndarray) -> None:
        super()._reset_task(ids)  # so101-reach's random target; the cube out of the way
        low = self.target[ids].copy()
        low[:, 2] = self.np_random.uniform(0.02, 0.05, size=len(ids))
        self._set_target(ids, low)  # the observed target and the green marker


register_task(TaskSpec("so101-reach-low", SO101ReachLow, OBS_MODES, REWARD_MODES, CONTROL_MODES,
                       SO101ReachLow.default_max_episode_steps))


def expert_success(num_envs: int = 16) -> float:
    env = rlrobot.make("so101-reach-low", num_envs=num_envs, seed=0)
    env.reset(seed=0)
    for _ in range(env.max_episode_steps):  # one episode with the scripted expert (so101-reach's, aiming at the target)
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
    success = info["episode"]["success"].float().mean().item()
    print(f"{env.instruction[0]!r}: scripted expert success {success:.2f}")
    env.close()
    return success


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/example-reach-low")
    parser.add_argument("--total-steps", type=int, default=300_000)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds), for the tests")
    args = parser.parse_args()
    expert_success()
    # no preset exists for this task: the run gets PPO's defaults; the flags below are the reach preset's essentials
    small = ["--num-envs", "32", "--eval-episodes", "4", "--logger", "none"] if args.smoke else ["--num-envs", "128"]
    rlrobot_cli(["train", "--task", "so101-reach-low", "--algo", "ppo", "--out", args.out, "--no-video",
                 "--total-steps", str(1_920 if args.smoke else args.total_steps), *small])
