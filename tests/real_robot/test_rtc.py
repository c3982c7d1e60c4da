"""Real-time chunking: guided sampling on a closed-form flow and a tiny trained flow policy, the executor on the twin."""

import math

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.checkpoints import save_checkpoint
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig, FlowSampling, MLPFlowPolicy
from rlrobot.policies.registry import policy_metadata
from rlrobot.policies.rtc import RTCConfig, RTCRequest, guidance_weight, prefix_weights, rtc_sample
from rlrobot.real_robot.bridge import TaskBridge
from rlrobot.real_robot.drivers.twin import TwinRobot
from rlrobot.real_robot.executor import ChunkExecutor, ExecutorConfig
from rlrobot.real_robot.policy_runtime import LoadedPolicy
from rlrobot.real_robot.safety import SafetyConfig, SafetySupervisor


class GaussianFlow(FlowSampling):
    """The exact velocity of flow matching onto chunks a ~ N(mu, s^2 I): E[a | x_t] in closed form, v = (x_t - a_hat) / t.
    Its Jacobian d a_hat / d x_t is diagonal, so guidance cannot leak into the chunk beyond the weighted overlap."""

    def __init__(self, mu: torch.Tensor, s: float, steps: int = 10):
        self.chunk_size, self.action_dim = mu.shape
        self.flat_dim, self.denoising_steps, self.execute_steps = mu.numel(), steps, self.chunk_size
        self.mu, self.s = mu.reshape(1, -1), s

    def encode(self, obs):
        return obs["state"]

    def velocity(self, x_t, t, emb):
        t = t[:, None]
        gain = (1 - t) * self.s ** 2 / ((1 - t) ** 2 * self.s ** 2 + t ** 2)
        a_hat = self.mu + gain * (x_t - (1 - t) * self.mu)
        return (x_t - a_hat) / t, x_t


def test_prefix_weights_and_guidance_weight():
    w = prefix_weights(2, 6, 8, "exp")
    assert w[:2].tolist() == [1.0, 1.0] and w[6:].tolist() == [0.0, 0.0]
    assert bool((w[2:6] > 0).all()) and bool((w[1:6].diff() < 0).all())  # strictly decaying over the overlap
    lin = prefix_weights(1, 4, 5, "linear")
    assert torch.allclose(lin, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    assert prefix_weights(2, 6, 8, "zeros").tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert prefix_weights(2, 6, 8, "ones").tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert prefix_weights(9, 3, 5, "exp").tolist() == [1, 1, 1, 0, 0]  # d past the leftover: all of it frozen
    assert guidance_weight(1.0, 5.0) == 5.0 and guidance_weight(0.0, 5.0) == 0.0
    t = 0.9  # paper time tau = 0.1: (1 - tau) / (tau r^2), r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)
    tau = 1 - t
    assert guidance_weight(t, 1e9) == pytest.approx((1 - tau) / tau * (tau ** 2 + (1 - tau) ** 2) / (1 - tau) ** 2)
    assert guidance_weight(0.5, 1.5) == 1.5


def test_guidance_on_the_closed_form_flow():
    torch.manual_seed(0)
    mu = torch.linspace(-0.5, 0.5, 16).reshape(8, 2)
    policy = GaussianFlow(mu, s=1.0)
    obs = {"state": torch.zeros(1, 3)}
    leftover = (mu[:6] + 0.8)[None]  # the previous plan, 0.8 away from this one everywhere on the overlap
    plain = policy.sample_actions(obs)
    off = rtc_sample(policy, obs, leftover, 2, RTCConfig(max_guidance_weight=0.0))
    assert torch.allclose(off, plain, atol=1e-6)  # weight 0 is the plain sample
    guided = rtc_sample(policy, obs, leftover, 2, RTCConfig(max_guidance_weight=5.0))
    gap_plain = (plain[0, :2] - leftover[0, :2]).abs().mean().item()
    gap_rtc = (guided[0, :2] - leftover[0, :2]).abs().mean().item()
    assert gap_plain == pytest.approx(0.8, abs=1e-4)
    assert gap_rtc < 0.1 * gap_plain, (gap_rtc, gap_plain)
    # the decaying overlap is pulled less than the frozen prefix, the tail not at all (diagonal Jacobian)
    pulls = (guided[0] - plain[0]).abs().mean(-1)
    assert pulls[2] > pulls[5] > 0 and torch.allclose(guided[0, 6:], plain[0, 6:], atol=1e-6)
    # LeRobot's identity-Jacobian variant pulls too, and also leaves the tail alone
    identity = rtc_sample(policy, obs, leftover, 2, RTCConfig(max_guidance_weight=5.0, jacobian="identity"))
    assert (identity[0, :2] - leftover[0, :2]).abs().mean().item() < 0.1 * gap_plain
    assert torch.allclose(identity[0, 6:], plain[0, 6:], atol=1e-6)


def test_guidance_on_a_tiny_trained_flow_policy():
    """A small MLP flow policy trained (a few hundred steps) on chunks around a fixed mean: RTC brings its first d actions
    to the leftover far closer than the plain sample does; weight 0 gives the plain sample."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = FlowPolicyConfig(chunk_size=6, denoising_steps=5, state_hidden=(16,), embed_dim=16, time_embed_dim=16,
                           velocity_hidden=(64, 64), noise_hidden=(8,), value_hidden=(8,))
    policy = MLPFlowPolicy({"state": (2,)}, 2, cfg)
    mu = torch.linspace(-0.4, 0.4, 12).reshape(6, 2)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
    obs = {"state": torch.zeros(256, 2)}
    for _ in range(300):
        actions = mu + 0.5 * torch.randn(256, 6, 2)
        loss = policy.flow_matching_loss(obs, actions, torch.rand(256), torch.randn(256, 6, 2))
        opt.zero_grad()
        loss.backward()
        opt.step()
    one = {"state": torch.zeros(1, 2)}
    leftover = (mu[:4] + torch.tensor([0.6, -0.6]))[None]
    plain = policy.sample_actions(one)
    assert torch.allclose(rtc_sample(policy, one, leftover, 2, RTCConfig(max_guidance_weight=0.0)), plain, atol=1e-5)
    guided = rtc_sample(policy, one, leftover, 2, RTCConfig(max_guidance_weight=5.0))
    gap_plain = (plain[0, :2] - leftover[0, :2]).abs().mean().item()
    gap_rtc = (guided[0, :2] - leftover[0, :2]).abs().mean().item()
    assert gap_plain > 0.4 and gap_rtc < 0.25 * gap_plain, (gap_rtc, gap_plain)
    opt.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    rtc_sample(policy, one, leftover, 2, RTCConfig())
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters())
    assert all(p.grad is None for p in policy.parameters())  # guidance differentiates x_t only


def test_bad_rtc_config_is_refused_in_one_line():
    for kwargs, field in [({"prefix_schedule": "cosine"}, "rtc.prefix_schedule"),
                          ({"max_guidance_weight": -1.0}, "rtc.max_guidance_weight"),
                          ({"max_guidance_weight": math.inf}, "rtc.max_guidance_weight"),
                          ({"inference_delay": -2}, "rtc.inference_delay"),
                          ({"execution_horizon": -1}, "rtc.execution_horizon"),
                          ({"jacobian": "exact"}, "rtc.jacobian")]:
        with pytest.raises(ValueError, match=field) as err:
            RTCConfig(**kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="open_loop"):
        ExecutorConfig(rtc=RTCConfig(enabled=True))
    with pytest.raises(ValueError, match="smaller than the policy's chunk"):
        RTCConfig(execution_horizon=8).horizon_for(8, 8)


def flow_checkpoint(root, chunk_size=8):
    """A small random flow policy on so101-reach (ee_delta), saved as a training run would."""
    torch.manual_seed(0)
    flow = FlowPolicyConfig(chunk_size=chunk_size, denoising_steps=4, state_hidden=(32,), embed_dim=32,
                            time_embed_dim=16, velocity_hidden=(64, 64), noise_hidden=(8,), value_hidden=(8,))
    cfg = train_config("sft", task="so101-reach", control_mode="ee_delta", logger="none", flow=flow)
    env = rlrobot.make("so101-reach", 1, control_mode="ee_delta")
    meta = policy_metadata(cfg, env)
    env.close()
    policy = MLPFlowPolicy({k: tuple(v) for k, v in meta["observation_space"].items()}, meta["action_dim"], flow)
    return save_checkpoint(root, "iter_000001", policy, {"train": cfg.to_dict(), **meta})


def _run_twin(policy, cfg, episodes=2, steps=48):
    twin = TwinRobot("so101-reach", seed=5)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    executor = ChunkExecutor(twin, bridge, policy, sup, cfg)
    results = []
    try:
        for k in range(episodes):
            if k:
                twin.reset_episode()
            results.append(executor.run_episode(steps))
    finally:
        executor.close()
        twin.disconnect()
        bridge.close()
    return results


def test_executor_with_rtc_on_the_twin(tmp_path):
    """Open-loop chunks with and without RTC through bridge, supervisor and executor on the twin: RTC requests a chunk
    every execution_horizon steps with the leftover, the episodes run to the end, and the new chunks' first actions
    agree with the leftover they were asked to continue far better than the plain chunks do."""
    torch.set_num_threads(1)
    policy = LoadedPolicy(str(flow_checkpoint(tmp_path / "ckpt")))
    assert policy.supports_rtc
    plain = _run_twin(policy, ExecutorConfig(mode="open_loop", realtime=False))
    rtc = RTCConfig(enabled=True, inference_delay=1, execution_horizon=4, max_guidance_weight=5.0)
    guided = _run_twin(policy, ExecutorConfig(mode="open_loop", realtime=False, rtc=rtc))
    for result in plain + guided:
        assert not result.aborted and result.steps == 48 and not result.latched and result.refused_chunks == 0
    # (how many re-plans happen depends on the machine's load: realtime=False runs as fast as inference allows)
    gap_plain = np.mean([r.chunk_gap["mean"] for r in plain if r.chunk_gap["count"]])
    gap_rtc = np.mean([r.chunk_gap["mean"] for r in guided if r.chunk_gap["count"]])
    assert gap_rtc < 0.5 * gap_plain, (gap_rtc, gap_plain)


def test_rtc_refused_for_a_policy_without_a_flow(tmp_path, expert_checkpoint):
    gaussian = LoadedPolicy(str(expert_checkpoint))
    assert not gaussian.supports_rtc
    twin = TwinRobot("so101-reach", seed=5)
    twin.connect()
    bridge = TaskBridge("so101-reach", "ee_delta")
    sup = SafetySupervisor(SafetyConfig(), twin.joint_low, twin.joint_high, 1 / twin.control_rate_hz, bridge.tcp_position)
    try:
        with pytest.raises(ValueError, match="executor.rtc.enabled needs a flow"):
            ChunkExecutor(twin, bridge, gaussian, sup, ExecutorConfig(mode="open_loop", rtc=RTCConfig(enabled=True)))
        with pytest.raises(ValueError, match="flow"):
            gaussian.infer({"state": np.zeros(gaussian.metadata["observation_space"]["state"], np.float32)},
                           rtc=RTCRequest(np.zeros((2, 3), np.float32), 1, RTCConfig()))
    finally:
        twin.disconnect()
        bridge.close()
