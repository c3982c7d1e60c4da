"""The robot-side task model gives a language-suite policy the instruction's tensors: the reading's instruction (the
twin reports its task), else the operator's (``rlrobot deploy --instruction``), encoded as the suite's env does."""

from __future__ import annotations

import numpy as np

import rlrobot
from rlrobot.real_robot.bridge import TaskBridge


def test_the_bridge_encodes_the_readings_or_the_operators_instruction_as_the_env_observes_it():
    env = rlrobot.make("so101-suite", 2, control_mode="joint_pos", seed=0)
    obs, _ = env.reset(seed=0)
    texts = list(env.instruction)
    bridge = TaskBridge("so101-suite", "joint_pos", keys=("state", "instruction_tokens", "instruction_embedding"))
    try:
        for i in range(2):
            reading = {"qpos": env.qpos[i, :6].copy(), "qvel": env.qvel[i, :6].copy(), "context": env.task_context(i),
                       "instruction": texts[i]}
            got = bridge.observation(reading)
            for key in ("instruction_tokens", "instruction_embedding"):
                assert np.array_equal(got[key][0], obs[key][i].numpy()), key
        other = next(t for t in env.instructions() if t not in texts)
        bridge.instruction = other  # what deploy --instruction sets; a reading without one gets it
        reading = {"qpos": env.qpos[0, :6].copy(), "qvel": env.qvel[0, :6].copy(), "context": env.task_context(0)}
        got = bridge.observation(reading)["instruction_tokens"]
        assert np.array_equal(got, env.instruction_observation([other])["instruction_tokens"])
    finally:
        bridge.close()
        env.close()
