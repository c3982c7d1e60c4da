"""The supervisor's default limits are the SO-101's servo limits, and they let a smooth reach policy through."""

import math

import numpy as np

from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.drivers.twin import TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.policy_runtime import LoadedPolicy
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor


def test_defaults_are_the_sts3215s_speed_and_lerobots_acceleration():
    cfg = SafetyConfig()
    no_load_speed = math.radians(60) / 0.222  # STS3215: 0.222 s / 60 deg
    lerobot_ramp = 254 * 100 * 2 * math.pi / 4096  # Acceleration register 254, unit 100 steps/s^2, 4096 steps a turn
    assert abs(cfg.max_joint_velocity - no_load_speed) / no_load_speed < 0.01
    assert abs(cfg.max_joint_acceleration - lerobot_ramp) / lerobot_ramp < 0.01


def test_default_limits_do_not_clamp_the_reach_expert_on_most_steps(expert_checkpoint):
    """The expert (a P-controller, saturated while far from the target) on the twin with the default limits: the
    supervisor changes its command on fewer than 10 % of steps (speeding up from rest at the start of an episode)
    and the episodes succeed as in simulation."""
    policy = LoadedPolicy(str(expert_checkpoint))
    twin = TwinRobot("so101-reach", seed=100)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    executor = ChunkExecutor(twin, bridge, policy, sup, ExecutorConfig(realtime=False))
    results = []
    for k in range(10):
        if k:
            twin.reset_episode()
        results.append(executor.run_episode(50))
    executor.close()
    twin.disconnect()
    bridge.close()
    steps = sum(r.steps - r.holds for r in results)
    clamped = sum(r.clamped_steps for r in results)
    assert steps == 500 and clamped / steps < 0.10, (clamped, steps, dict(sup.interventions))
    assert np.mean([r.success for r in results]) >= 0.9
    assert all(r.episode_return is not None and r.episode_return > 0 for r in results)
