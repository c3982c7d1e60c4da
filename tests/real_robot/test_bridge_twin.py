"""Robot-side task model against the simulator, the twin's hardware-like options, and in-process deployment."""

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.drivers.twin import TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.policy_runtime import LoadedPolicy
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor


@pytest.mark.parametrize("task, control_mode", [("so101-reach", "ee_delta"), ("so101-push", "joint_delta"),
                                                ("so101-lift", "joint_pos")])
def test_bridge_reproduces_the_simulators_observation_and_control(task, control_mode):
    env = rlrobot.make(task, 1, control_mode=control_mode, seed=3)
    obs, _ = env.reset(seed=3)
    bridge = TaskBridge(task, control_mode)
    rng = np.random.default_rng(0)
    for _ in range(5):
        reading = {"qpos": env.qpos[0, :6].copy(), "qvel": env.qvel[0, :6].copy(), "context": env.task_context(0)}
        assert np.allclose(bridge.observation(reading)["state"][0], obs["state"][0].numpy(), atol=1e-5)
        action = rng.uniform(-1, 1, env.action_dim)
        targets = bridge.joint_targets(action, reading, env.ctrl[0].copy())
        obs, *_ = env.step(torch.as_tensor(action, dtype=torch.float32)[None])
        assert np.allclose(targets, env.ctrl[0], atol=1e-9)  # the joint targets the simulator commanded
    bridge.close()
    env.close()


def test_twin_latency_and_noise():
    twin = TwinRobot("so101-reach", seed=1, latency_steps=2, obs_noise_std=0.01)
    twin.connect()
    start = twin.observe()["qpos"]
    target = start + np.array([0.3, 0, 0, 0, 0, 0])
    for _ in range(2):
        twin.act(target)
    moved_early = np.abs(twin.env.ctrl[0, 0] - target[0])
    twin.act(target)
    assert moved_early > 0.2 and twin.env.ctrl[0, 0] == pytest.approx(target[0])  # applied 2 steps late
    noisy = [twin.observe()["qpos"][0] for _ in range(20)]
    assert np.std(noisy) > 0.003
    twin.disconnect()


def test_in_process_deployment_matches_simulation(expert_checkpoint):
    """The expert-weights policy through bridge, supervisor and executor on the twin succeeds as in simulation."""
    from rlrobot.runners.evaluation import evaluate

    policy = LoadedPolicy(str(expert_checkpoint))
    env = rlrobot.make("so101-reach", 10, seed=7)
    sim = evaluate(policy.policy, env, 10, seed=7)
    env.close()
    twin = TwinRobot("so101-reach", seed=100)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    executor = ChunkExecutor(twin, bridge, policy, sup, ExecutorConfig(realtime=False))
    successes = []
    for k in range(10):
        if k:
            twin.reset_episode()
        result = executor.run_episode(50)
        assert not result.aborted and result.steps == 50 and result.holds == 0
        successes.append(result.success)
    executor.close()
    assert sim["success_rate"] >= 0.9
    assert abs(np.mean(successes) - sim["success_rate"]) <= 0.2


def test_estop_mid_episode_holds_disables_and_stays_latched(expert_checkpoint):
    policy = LoadedPolicy(str(expert_checkpoint))
    twin = TwinRobot("so101-reach", seed=4)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz)

    class PressesEstop:
        calls = 0

        def infer(self, obs):
            self.calls += 1
            if self.calls == 10:
                sup.estop("operator")
            return policy.infer(obs)

    executor = ChunkExecutor(twin, bridge, PressesEstop(), sup, ExecutorConfig(realtime=False))
    result = executor.run_episode(50)
    assert result.aborted and "e-stop (operator)" in result.abort_reason and result.steps <= 11
    assert [kind for _, kind, _ in list(twin.commands)[-2:]] == ["hold", "disable"] and twin.disabled
    twin.reset_episode()
    assert executor.run_episode(5).aborted  # latched until an operator clears it
    sup.clear_estop()
    twin.reset_episode()  # re-enable the (disabled) robot
    assert not executor.run_episode(5).aborted
    executor.close()
