"""A trained policy loaded from its checkpoint alone, answering observation -> action chunk (server or local)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlrobot.checkpoints import load_checkpoint
from rlrobot.config import config_from_checkpoint
from rlrobot.policies.registry import build_policy, policy_kind_of
from rlrobot.policies.rtc import RTCConfig, RTCRequest

from .protocol import ProtocolError
from .stats import RunningStats


class LoadedPolicy:
    """Deterministic inference of any rlrobot policy; ``infer`` returns an action chunk ``[chunk_size, action_dim]``
    (Gaussian and SAC policies act one step at a time: chunk size 1; flow policies return their whole chunk, and the
    executor runs it open-loop or ensembles it)."""

    def __init__(self, checkpoint: str, device: str = "cpu"):
        weights, saved, ckpt = load_checkpoint(checkpoint)
        self.cfg = config_from_checkpoint(saved)
        self.policy = build_policy(saved, self.cfg)
        self.policy.load_state_dict(weights)
        self.device = torch.device(device)
        self.policy.to(self.device).eval()
        self.checkpoint = str(ckpt)
        self.chunked = hasattr(self.policy, "sample_actions")
        # every key the actor reads (an MLP actor's cameras and instruction too), not only its state vector
        self.obs_keys = list(getattr(self.policy, "obs_keys", None) or [self.cfg.policy.obs_key])
        self.obs_key = self.obs_keys[0]
        self.metadata: dict[str, Any] = {
            "policy_kind": policy_kind_of(saved),
            "task": saved["task"],
            "control_mode": saved.get("control_mode"),
            "observation_space": saved["observation_space"],
            "obs_keys": self.obs_keys,
            "action_dim": saved["action_dim"],
            "chunk_size": int(self.policy.chunk_size) if self.chunked else 1,
            "execute_steps": int(self.policy.execute_steps) if self.chunked else 1,
            "control_rate_hz": 1.0 / saved["control_dt"] if saved.get("control_dt") else None,
            "checkpoint": self.checkpoint,
        }
        self.latencies = RunningStats(scale=1e3)
        """inference time of every call, ms (bounded: count/mean/max exact, percentiles over a recent window)"""

    def check_observation(self, obs: Any) -> dict[str, np.ndarray]:
        if not isinstance(obs, dict):
            raise ProtocolError("bad_request", "obs must be a map of arrays")
        out = {}
        for key in self.metadata["obs_keys"]:
            shape = tuple(self.metadata["observation_space"][key])
            value = obs.get(key)
            if not isinstance(value, np.ndarray):
                raise ProtocolError("bad_request", f"obs[{key!r}] is missing or not an array")
            if value.shape not in (shape, (1, *shape)):
                raise ProtocolError("bad_request", f"obs[{key!r}] has shape {value.shape}, expected {shape}")
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise ProtocolError("bad_request", f"obs[{key!r}] contains NaN or Inf")
            out[key] = value.reshape(1, *shape)
        return out

    @property
    def supports_rtc(self) -> bool:
        """Real-time chunking needs a flow policy (guided denoising through its velocity network)."""
        return self.chunked and hasattr(self.policy, "step_velocity") and hasattr(self.policy, "encode")

    def infer(self, obs: dict[str, np.ndarray], rtc: RTCRequest | None = None) -> np.ndarray:
        """Action chunk [chunk, action_dim] float32 (what the executor calls, like PolicyClient.infer); ``rtc``: guide
        it towards the previous chunk's leftover (real-time chunking, policies/rtc.py)."""
        if rtc is not None:
            return self.infer_rtc(obs, rtc)[0]
        return self.infer_timed(obs)[0]

    def infer_rtc(self, obs: dict[str, np.ndarray], rtc: RTCRequest) -> tuple[np.ndarray, float]:
        """(RTC-guided actions [chunk, action_dim] float32, inference seconds). Not under inference_mode: the guidance
        differentiates the velocity network with respect to x_t (no parameter gets a gradient)."""
        from rlrobot.policies.rtc import rtc_sample

        if not self.supports_rtc:
            raise ValueError(f"real-time chunking needs a flow (chunk) policy; this checkpoint is a "
                             f"{self.metadata['policy_kind']!r} policy")
        batch = self.check_observation(obs)
        leftover = np.asarray(rtc.leftover, np.float32).reshape(1, -1, self.metadata["action_dim"])
        start = time.perf_counter()
        tensors = {k: torch.from_numpy(np.array(v, np.float32)).to(self.device) for k, v in batch.items()}
        chunk = rtc_sample(self.policy, tensors, torch.from_numpy(leftover).to(self.device), rtc.inference_delay, rtc.cfg)
        result = chunk[0].float().cpu().numpy()
        elapsed = time.perf_counter() - start
        self.latencies.append(elapsed)
        return result, elapsed

    def warm_up_rtc(self) -> None:
        """One guided chunk on a zero observation: the first backward pass of a process initialises autograd (~1 s on
        a loaded CPU), which must not land in the control loop (the watchdog would disable the arm)."""
        obs = {k: np.zeros(self.metadata["observation_space"][k], np.float32) for k in self.obs_keys}
        leftover = np.zeros((self.metadata["chunk_size"], self.metadata["action_dim"]), np.float32)
        self.infer_rtc(obs, RTCRequest(leftover, 1, RTCConfig()))
        self.latencies = RunningStats(scale=1e3)  # the warm-up is not an inference of the run

    @torch.inference_mode()
    def infer_timed(self, obs: dict[str, np.ndarray]) -> tuple[np.ndarray, float]:
        """(actions [chunk, action_dim] float32, inference seconds)."""
        batch = self.check_observation(obs)
        start = time.perf_counter()
        # a copy: arrays decoded from a frame are read-only views of it, and torch warns about (and must not share)
        # non-writable memory
        tensors = {k: torch.from_numpy(np.array(v, np.float32)).to(self.device) for k, v in batch.items()}
        action = self.policy.sample_actions(tensors) if self.chunked else self.policy.act(tensors, deterministic=True)
        chunk = action.reshape(-1, self.metadata["chunk_size"], self.metadata["action_dim"])[0]
        result = chunk.float().cpu().numpy()
        elapsed = time.perf_counter() - start
        self.latencies.append(elapsed)
        return result, elapsed

