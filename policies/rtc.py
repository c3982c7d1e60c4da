"""Real-time chunking (RTC): guided flow sampling that inpaints the previous chunk's unexecuted leftover.

Black et al., "Real-Time Execution of Action Chunking Flow Policies" (2025). While the robot executes chunk n, chunk
n + 1 is generated; by the time it arrives, ``d`` (the inference delay) more actions of chunk n have run. RTC treats the
new chunk as an inpainting problem: its first ``d`` actions are frozen to chunk n's leftover (they run anyway), the
rest of the overlap is pulled towards the leftover with a decaying weight, and the tail is free. At every denoising
step the velocity is corrected with a vector-Jacobian product through the velocity network (pseudo-inverse guidance):

    a_hat(x_t) = x_t - t v(x_t, t)                       (the one-step estimate of the clean chunk, t = 1 noise)
    v_guided   = v - w(t) * (d a_hat / d x_t)^T [W * (Y - a_hat)]
    w(t)       = min(max_guidance_weight, t / (1 - t) * (t^2 + (1 - t)^2) / t^2)

with Y the leftover zero-padded to the chunk length and W the prefix weights (1 for i < d, a decaying schedule over the
rest of the leftover, 0 beyond). In the paper's time (tau = 1 - t, tau = 1 data) w is min(beta, (1 - tau) / (tau r^2)),
r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2). The Euler step then uses v_guided exactly as the plain ODE step uses v.

Why it lives in ``policies/`` (not in ``real_robot/``): it is a sampler over the ``FlowPolicy`` protocol
(``encode`` / ``step_velocity``), the same for the in-house flow policy and the VLA adapters, and usable in simulation;
the executor only supplies the leftover and the delay.

Difference from LeRobot's ``RTCProcessor`` (0.6.x): LeRobot computes ``v_t`` before ``x_t`` requires grad, so its
"correction" is the weighted error itself (the Jacobian of a_hat taken as the identity); here the vector-Jacobian
product goes through the velocity network as in the paper (one extra backward pass per denoising step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .flow import time_grid

RTC_SCHEDULES = ("exp", "linear", "ones", "zeros")
RTC_JACOBIANS = ("vjp", "identity")


@dataclass
class RTCConfig:
    enabled: bool = False
    """real-time chunking: generate each chunk guided towards the previous chunk's unexecuted leftover (needs
    executor.mode=open_loop and a policy run in this process: --checkpoint)"""
    inference_delay: int = -1
    """d: actions of the current chunk executed while the next one is computed (frozen in the new chunk); -1 = measured
    from the recent inference latencies, ceil(median / control period)"""
    execution_horizon: int = 0
    """s: control steps between chunk requests (0 = the policy's execute_steps if shorter than its chunk, else half the
    chunk); the overlap that is guided is the rest of the chunk"""
    prefix_schedule: str = "exp"
    """weights over the overlap after the first d steps: exp (the paper's), linear, ones, zeros (only the d steps)"""
    max_guidance_weight: float = 5.0
    """beta: cap of the guidance weight w(t) (which is infinite at t = 1); 0 turns guidance off (the plain sample)"""
    jacobian: str = "vjp"
    """vjp: the correction is (d a_hat / d x_t)^T W (Y - a_hat), a backward pass through the velocity network (the
    paper); identity: W (Y - a_hat) itself (LeRobot's RTCProcessor; no backward pass, and it still pulls a policy whose
    a_hat barely depends on x_t, i.e. a confident, near-deterministic one)"""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        if self.prefix_schedule not in RTC_SCHEDULES:
            raise ValueError(f"rtc.prefix_schedule={self.prefix_schedule!r} is not one of {RTC_SCHEDULES}")
        if not (isinstance(self.max_guidance_weight, (int, float)) and math.isfinite(self.max_guidance_weight)
                and self.max_guidance_weight >= 0):
            raise ValueError(f"rtc.max_guidance_weight={self.max_guidance_weight!r} must be a finite number >= 0")
        if self.jacobian not in RTC_JACOBIANS:
            raise ValueError(f"rtc.jacobian={self.jacobian!r} is not one of {RTC_JACOBIANS}")
        if not isinstance(self.inference_delay, int) or self.inference_delay < -1:
            raise ValueError(f"rtc.inference_delay={self.inference_delay!r} must be an integer >= 0 (or -1: measured)")
        if not isinstance(self.execution_horizon, int) or self.execution_horizon < 0:
            raise ValueError(f"rtc.execution_horizon={self.execution_horizon!r} must be an integer >= 1 (or 0: the "
                             f"policy's execute_steps)")

    def horizon_for(self, chunk_size: int, execute_steps: int) -> int:
        """s for a policy of this chunk size: the configured one (checked against the chunk), else a default."""
        if self.execution_horizon:
            if self.execution_horizon >= chunk_size:
                raise ValueError(f"rtc.execution_horizon={self.execution_horizon} must be smaller than the policy's "
                                 f"chunk ({chunk_size}): nothing would be left to overlap")
            return self.execution_horizon
        return execute_steps if 0 < execute_steps < chunk_size else max(1, chunk_size // 2)


@dataclass
class RTCRequest:
    """What the executor sends with an observation: the previous chunk's unexecuted actions [L, action_dim] (from the
    request's step on) and the inference delay d."""

    leftover: np.ndarray
    inference_delay: int
    cfg: RTCConfig


def prefix_weights(inference_delay: int, overlap: int, total: int, schedule: str = "exp") -> torch.Tensor:
    """[total] weights: 1 for i < d, the schedule decaying from 1 to 0 (exclusive) over d <= i < overlap, 0 beyond.
    exp is the paper's c_i (e^{c_i} - 1) / (e - 1) with c_i the linear ramp."""
    if schedule not in RTC_SCHEDULES:
        raise ValueError(f"rtc.prefix_schedule={schedule!r} is not one of {RTC_SCHEDULES}")
    overlap = max(0, min(overlap, total))
    d = max(0, min(inference_delay, overlap))
    w = torch.zeros(total)
    w[:d] = 1.0
    n = overlap - d
    if n > 0 and schedule != "zeros":
        if schedule == "ones":
            ramp = torch.ones(n)
        else:
            ramp = torch.linspace(1.0, 0.0, n + 2)[1:-1]
            if schedule == "exp":
                ramp = ramp * torch.expm1(ramp) / (math.e - 1.0)
        w[d:overlap] = ramp
    return w


def guidance_weight(t: float, max_guidance_weight: float) -> float:
    """min(beta, t / (1 - t) * (t^2 + (1 - t)^2) / t^2) for t in (0, 1] (t = 1 noise); beta at t = 1."""
    if t >= 1.0:
        return float(max_guidance_weight)
    if t <= 0.0:
        return 0.0
    return float(min(max_guidance_weight, t / (1.0 - t) * (t * t + (1.0 - t) ** 2) / (t * t)))


def rtc_sample(policy, obs: dict[str, torch.Tensor], leftover: torch.Tensor | None, inference_delay: int,
               cfg: RTCConfig, x_init: torch.Tensor | None = None, emb=None) -> torch.Tensor:
    """Action chunks [B, H, A] from the deterministic ODE (x_init = 0 by default, as ``sample_actions``) with RTC
    guidance towards ``leftover`` [B, L, A] (L <= H; None or max_guidance_weight 0: the plain sample). Parameters get no
    gradient; only x_t is differentiated."""
    with torch.no_grad():
        emb = policy.encode(obs) if emb is None else emb
    batch, flat = len(emb), policy.flat_dim
    device = emb.device
    x = torch.zeros(batch, flat, device=device) if x_init is None else x_init.reshape(batch, flat).to(device)
    guided = leftover is not None and cfg.max_guidance_weight > 0 and leftover.shape[1] > 0
    if guided:
        length = min(leftover.shape[1], policy.chunk_size)
        target = torch.zeros(batch, policy.chunk_size, policy.action_dim, device=device)
        target[:, :length] = policy.actions_to_chain(leftover[:, :length].to(device=device, dtype=target.dtype))
        w = prefix_weights(inference_delay, length, policy.chunk_size, cfg.prefix_schedule).to(device)
        target, weights = target.reshape(batch, flat), w[:, None].expand(-1, policy.action_dim).reshape(1, flat)
    grid = time_grid(policy.denoising_steps, device)
    with policy.hidden_chain_state(batch, device) as advance:
        for k in range(policy.denoising_steps):
            x = _rtc_step(policy, x, k, grid, emb, guided, target if guided else None, weights if guided else None, cfg)
            advance(float(grid[k] - grid[k + 1]))
    return policy.chain_actions(x)


def _rtc_step(policy, x: torch.Tensor, k: int, grid: torch.Tensor, emb, guided: bool, target: torch.Tensor | None,
              weights: torch.Tensor | None, cfg: RTCConfig) -> torch.Tensor:
    """One guided (or plain) Euler step of ``rtc_sample``: one velocity call."""
    batch = x.shape[0]
    t, t_next = grid[k].expand(batch), grid[k + 1]
    tk = float(grid[k])
    if guided and cfg.jacobian == "identity":
        with torch.no_grad():
            v, _ = policy.step_velocity(x, t, t_next, emb)
            v = v - guidance_weight(tk, cfg.max_guidance_weight) * weights * (target - (x - tk * v))
    elif guided:
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            v, _ = policy.step_velocity(xg, t, t_next, emb)
            a_hat = xg - tk * v
            err = (weights * (target - a_hat)).detach()
            correction, = torch.autograd.grad(a_hat, xg, grad_outputs=err)
        v = v.detach() - guidance_weight(tk, cfg.max_guidance_weight) * correction
    else:
        with torch.no_grad():
            v, _ = policy.step_velocity(x, t, t_next, emb)
    with torch.no_grad():  # the ODE step written as FlowSampling.step_distribution writes it
        a_hat, eps_hat = x - tk * v, x + (1.0 - tk) * v
        x = a_hat * (1.0 - t_next) + eps_hat * t_next
    return x
