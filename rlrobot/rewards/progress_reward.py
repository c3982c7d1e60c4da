"""``--reward.shaping prm:PATH``: a learned process reward model's progress as the training reward.

The model (``rlrobot.rewards.progress_model``, trained by ``rlrobot train --algo prm`` or ``--algo sarm``) maps
(obs_before, obs_after, instruction) to a relative progress delta in [-1, 1] and a done probability. The wrapper adds
to the env's reward (use ``--reward-mode sparse``: success plus the model's progress) one of (``--reward.prm.mode``):

* ``potential`` (default; measured better than raw on so101-reach, see the README's PRM-RL tables): potential-based shaping
  gamma Phi(s') - Phi(s) with Phi(s_t) = max(0, delta(s_0, s_t)): the progress of the current frame relative to the
  episode's first frame, which is VLAC's value of s_t after one update from V_0 = 0 (V = 0 + (1 - 0) delta). One model
  call per step, and per episode the shaped discounted return differs from the task's only by the boundary terms
  (gamma^T Phi(s_T) [0 when terminated] - Phi(s_0) = ... - 0), so the task's optimal policy is kept;
* ``raw``: the per-step delta(s_t, s_{t+1}) itself (VLAC's dense reward): dense, but a sum of noisy deltas, and not
  potential-based (a policy can farm progress that it later undoes);
* ``progress``: Phi(s_{t+1}) itself, the progress of the frame reached (a level, as a hand-written staged reward pays
  reach / grasp / lift levels every step). Not potential-based: it changes what is optimal (scale it below the task's
  success reward), but unlike ``potential`` its advantages differ from the task's once the critic fits: a potential
  term cancels out of Q - V for every policy, so on a task where the policy never succeeds it teaches nothing
  (measured on so101-lift from scratch: README, RL from learned rewards).

``--reward.prm.scale`` multiplies the term. ``--reward.prm.done`` ends an episode (terminated) on the first step whose
done probability exceeds the model's ``done_threshold`` (native tasks: the env's per-env reset is used; the episode's
statistics are reported as for any other end). ``info["final_obs"]``, ``info["episode"]`` (``return`` = the wrapped
return, ``task_return`` = the task's, ``success`` the task's own judgement) and the new episodes' first observations
stay consistent; the wrapper's per-env state (first and last observations, Phi, running return) travels with
checkpoints.

The instruction: the env's ``instruction_embedding`` observation where it has one (the suite), else a zero embedding:
the convention of ``rlrobot train --algo prm`` for single-task datasets outside the suite (their one instruction
carries no information; no sentence encoder is loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from rlrobot.domains import Positive
from rlrobot.envs.language import EMBEDDING_DIM, EMBEDDING_KEY
from rlrobot.rewards.discount import ChunkDiscount
from rlrobot.rewards.progress_model import load_progress_model, split_prm_paths
from rlrobot.rewards.registry import RewardFactory, RewardSpec, register_reward
from rlrobot.sections import Section
from rlrobot.tasks.registry import is_adapter_task

PRM_MODES = ("potential", "raw", "progress")


@dataclass
class ProgressRewardConfig(Section):
    """``--reward.prm.*``: how the progress model's output becomes reward."""

    mode: Literal["potential", "raw", "progress"] = "potential"
    """potential: gamma Phi(s') - Phi(s) with Phi(s_t) = progress of s_t from the episode's first frame | raw: the
    per-step progress delta (s_t -> s_t+1) | progress: Phi(s_t+1) itself, a level reward (not potential-based)"""
    scale: Positive = 1.0
    """weight of the progress term"""
    done: bool = False
    """end an episode (terminated) when the model's done probability exceeds its threshold"""

    def validate(self, run: Any) -> None:
        if self.mode not in PRM_MODES:
            raise ValueError(f"reward.prm.mode={self.mode!r} is not one of {PRM_MODES}")
        if not self.scale > 0:
            raise ValueError(f"reward.prm.scale must be > 0, got {self.scale}")
        if self.done and is_adapter_task(run.task):
            raise ValueError(f"reward.prm.done ends single episodes, which needs a native task; task={run.task!r}")


def check_prm_path(path: str, field: str = "reward.shaping") -> None:
    """Before any compute: the PRM checkpoint must exist (its observation space is checked when the env is built)."""
    if not path:
        raise ValueError(f"{field}: prm:PATH needs a path to a PRM run or checkpoint (rlrobot train --algo prm)")
    for one in split_prm_paths(path):  # A,B,C: an ensemble of runs
        if not one or not Path(one).exists():
            raise ValueError(f"{field}: PRM checkpoint {one!r} does not exist (train one with rlrobot train --algo prm; "
                             "an ensemble is RUN,RUN,...)")


def load_prm(path: str, env: Any, device: torch.device | str) -> Any:
    """The PRM at ``path`` for ``env``: refused (ValueError naming the key) if it reads another observation space."""
    check_prm_path(path)
    return load_progress_model(path, device, observation_space=env.single_observation_space)


class InstructionEmbedder:
    """[N, 384] instruction embeddings of the current episodes: the observation where the env has it, else zeros (how
    the PRM was trained on a single-task dataset outside the suite)."""

    def __init__(self, env: Any):
        self.env = env

    def __call__(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if EMBEDDING_KEY in obs:
            return obs[EMBEDDING_KEY].float()
        first = obs[next(iter(obs))]
        return torch.zeros(len(first), EMBEDDING_DIM, device=first.device)


def prm_features(path: str, env: Any, device: torch.device | str) -> Any:
    """SRPO's per-frame features from a PRM's observation encoder: obs -> [N, embed_dim] (no gradients)."""
    model = load_prm(path, env, device)
    encoder = getattr(model, "encoder", None)
    if encoder is None:
        raise ValueError(f"PRM {path!r} has no observation encoder to embed trajectories with")

    @torch.no_grad()
    def features(obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return encoder({k: obs[k] for k in model.obs_keys}).float()

    return features


def _clone(obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in obs.items()}


class PRMReward(ChunkDiscount):
    """The env's reward plus ``scale`` x the progress term of ``mode`` (module docstring); with ``end_on_done`` an
    episode ends where the model's done probability passes its threshold."""

    def __init__(self, env: Any, model: Any, gamma: float, mode: str = "potential", scale: float = 1.0,
                 end_on_done: bool = False):
        if mode not in PRM_MODES:
            raise ValueError(f"reward.prm.mode={mode!r} is not one of {PRM_MODES}")
        if end_on_done and not hasattr(env, "_reset_ids"):
            raise ValueError(f"reward.prm.done needs a native task (it resets single envs); {type(env).__name__} is not one")
        self.env, self.model, self.gamma, self.mode, self.scale = env, model, float(gamma), mode, float(scale)
        self.end_on_done = end_on_done
        self.keys = tuple(model.obs_keys)
        self.embed = InstructionEmbedder(env)
        n = env.num_envs
        self.phi = torch.zeros(n, device=env.device)
        self.wrapped_return = torch.zeros(n, device=env.device)
        self.first: dict[str, torch.Tensor] = {}
        self.last: dict[str, torch.Tensor] = {}
        self.instruction_embedding = torch.zeros(n, 0, device=env.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def _view(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: obs[k] for k in self.keys}

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        self.first, self.last = _clone(self._view(obs)), _clone(self._view(obs))
        self.instruction_embedding = self.embed(obs)
        self.phi.zero_()
        self.wrapped_return.zero_()
        return obs, info

    def step(self, action: torch.Tensor):
        instruction = self.instruction_embedding  # the episodes being stepped (autoreset may change it)
        obs, reward, terminated, truncated, info = self.env.step(action)
        after = self._view(info["final_obs"])
        before = self.last if self.mode == "raw" else self.first
        delta, done_prob = self.model.progress(before, after, instruction)
        delta, done_prob = delta.to(reward.device).float(), done_prob.to(reward.device).float()
        if self.end_on_done:
            obs, terminated, truncated, info = self._end_on_done(obs, terminated, truncated, info, done_prob)
            after = self._view(info["final_obs"])
        done = terminated | truncated
        if self.mode == "potential":
            next_phi = delta.clamp_min(0.0)
            term = self.step_gamma() * next_phi * (~terminated).float() - self.phi
            self.phi = torch.where(done, torch.zeros_like(next_phi), next_phi)
        elif self.mode == "progress":
            term = delta.clamp_min(0.0)
        else:
            term = delta
        shaped = reward + self.scale * term
        self.wrapped_return += shaped
        info["prm_progress"], info["prm_done"] = delta, done_prob
        view = self._view(obs)
        self.last = _clone(view)
        self.instruction_embedding = self.embed(obs)
        if done.any():
            for k in self.keys:
                self.first[k][done] = view[k][done]
            ids = info["episode"]["env_ids"]
            info["episode"] = {**info["episode"], "task_return": info["episode"]["return"],
                               "return": self.wrapped_return[ids].clone()}
            self.wrapped_return[done] = 0.0
        return obs, shaped, terminated, truncated, info

    # ------------------------------------------------------------ PRM done ends episodes
    def _end_on_done(self, obs, terminated, truncated, info, done_prob):
        """Envs whose done probability exceeds the model's threshold (and whose episode did not end anyway) end here,
        terminated: their statistics join ``info["episode"]``, ``final_obs`` keeps their last frame, and they reset."""
        env = self.env
        ended = (done_prob > self.model.done_threshold) & ~(terminated | truncated)
        if not ended.any():
            return obs, terminated, truncated, info
        ids_t = ended.nonzero().flatten()
        ids = ids_t.cpu().numpy()
        final = _clone(info["final_obs"])  # a copy: info["final_obs"] may be ``obs`` itself when no episode ended
        t = env._to_tensor
        episode = {"env_ids": ids_t.to(env.device), "return": t(env.episode_return[ids].astype(np.float32)),
                   "length": t(env.elapsed_steps[ids]), "success": info["success"][ids_t].clone(),
                   "success_once": t(env.success_once[ids])}
        if "episode" in info and "instruction" in info["episode"]:
            texts = env.instruction
            episode["instruction"] = [texts[i] for i in ids.tolist()]
        if "episode" in info and "family" in info["episode"]:
            episode["family"] = t(env.family[ids])
        env._reset_ids(ids)
        obs = env.observe()
        if "episode" in info:  # merge with the episodes that ended by themselves
            old = info["episode"]
            episode = {k: (old[k] + episode[k] if isinstance(old[k], list) else torch.cat([old[k], episode[k]]))
                       for k in old if k in episode}
        info = {**info, "episode": episode, "final_obs": final}
        terminated = terminated | ended
        return obs, terminated, truncated, info

    # ------------------------------------------------------------ checkpoints
    def get_state(self) -> dict[str, Any]:
        state = self.env.get_state()
        arrays = {**state["arrays"], "prm.phi": self.phi.cpu().numpy(), "prm.return": self.wrapped_return.cpu().numpy(),
                  **{f"prm.first.{k}": v.cpu().numpy() for k, v in self.first.items()},
                  **{f"prm.last.{k}": v.cpu().numpy() for k, v in self.last.items()}}
        return {**state, "arrays": arrays}

    def set_state(self, state: dict[str, Any]) -> None:
        arrays = dict(state["arrays"])
        dev = self.env.device

        def take(name: str) -> torch.Tensor:
            return torch.as_tensor(np.asarray(arrays.pop(name)), device=dev).clone()

        self.phi, self.wrapped_return = take("prm.phi"), take("prm.return")
        self.first = {k: take(f"prm.first.{k}") for k in self.keys}
        self.last = {k: take(f"prm.last.{k}") for k in self.keys}
        self.env.set_state({**state, "arrays": arrays})
        self.instruction_embedding = self.embed(self.env.observe())


def _make_prm(gamma: float | None, settings: ProgressRewardConfig, argument: str) -> RewardFactory:
    def wrap(env: Any) -> PRMReward:
        model = load_prm(argument, env, env.device)  # refuses a PRM of another observation space, before any step
        return PRMReward(env, model, gamma if gamma is not None else 0.99, settings.mode, settings.scale, settings.done)

    return wrap


register_reward(RewardSpec(
    "prm", "a process reward model's progress (a run of rlrobot train --algo prm or --algo sarm; RUN,RUN,... an "
    "ensemble)", _make_prm, ProgressRewardConfig, "prm", argument="PATH"))
