"""``--reward.shaping disagreement``: an exploration bonus from the disagreement of an ensemble of dynamics models
(Pathak, Gandhi & Gupta 2019, "Self-Supervised Exploration via Disagreement").

``members`` small MLPs f_k(s, a) predict the change of the state observation, s' - s, and learn online from the
rollout's own transitions: after every env step each member takes ``updates_per_step`` Adam steps on that step's
batch (one transition per env; the members differ by their initialisation only). Where transitions like it have been
seen, the members agree; where the policy reaches something new, they disagree. The bonus of a transition,

    b = scale * mean_d Var_k[ f_k(s, a)_d ]     (d over the state dimensions, Var over the members)

is computed by the members *before* they learn from it, and added to the env's reward. Inputs are the state
standardised with a running mean and std of the states seen and the action; targets are the state change divided by
its running std (so joint angles, velocities and positions weigh alike). The bonus fades where the policy keeps
going and stays where it has not been: use it beside a sparse task reward (``--reward-mode sparse``).

``info["disagreement"]`` holds each step's bonus before scaling; the ensemble, its Adam moments, the running
statistics and the wrapped return travel with checkpoints (``get_state`` / ``set_state``), so a resume is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rlrobot.domains import AnyInt, Positive, PositiveInt
from rlrobot.rewards.registry import RewardFactory, RewardSpec, register_reward
from rlrobot.sections import Section

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass
class DisagreementConfig(Section):
    """``--reward.disagreement.*``: the ensemble and the weight of its bonus."""

    scale: Positive = 0.1
    """weight of the bonus (the members' variance of the standardised state change, averaged over its dimensions)"""
    members: PositiveInt = 5
    """dynamics models in the ensemble (at least 2: one model has no disagreement)"""
    hidden: PositiveInt = 64
    """width of each member's two hidden layers"""
    lr: Positive = 1e-3
    """Adam learning rate of the members"""
    updates_per_step: PositiveInt = 1
    """Adam steps of every member on each env step's batch of transitions"""
    seed: AnyInt = 0
    """seeds the members' initialisation (their own generator: the run's other random streams are untouched)"""

    def validate(self, run: Any) -> None:
        if self.members < 2:
            raise ValueError(f"reward.disagreement.members must be >= 2 (one model has no disagreement), got {self.members}")
        if not self.scale > 0 or not self.lr > 0:
            raise ValueError(f"reward.disagreement.scale and lr must be > 0, got {self.scale} and {self.lr}")


class RunningMoments:
    """Mean and variance of the rows seen so far (Chan et al.'s batched update), in float64."""

    def __init__(self, dim: int, device: torch.device | str):
        self.count = torch.zeros((), dtype=torch.float64, device=device)
        self.mean = torch.zeros(dim, dtype=torch.float64, device=device)
        self.m2 = torch.zeros(dim, dtype=torch.float64, device=device)

    def update(self, x: Tensor) -> None:
        x = x.double()
        n_b, mean_b = float(len(x)), x.mean(0)
        delta = mean_b - self.mean
        total = self.count + n_b
        self.mean = self.mean + delta * n_b / total
        self.m2 = self.m2 + ((x - mean_b) ** 2).sum(0) + delta**2 * self.count * n_b / total
        self.count = total

    def std(self) -> Tensor:
        return (self.m2 / self.count.clamp_min(1.0)).sqrt().clamp_min(1e-3).float()

    def as_array(self) -> np.ndarray:
        return torch.cat([self.count[None], self.mean, self.m2]).cpu().numpy()

    def load(self, array: np.ndarray) -> None:
        values = torch.as_tensor(array, dtype=torch.float64, device=self.mean.device)
        dim = len(self.mean)
        self.count, self.mean, self.m2 = values[0].clone(), values[1:1 + dim].clone(), values[1 + dim:].clone()


class DynamicsEnsemble:
    """``members`` MLPs (in -> hidden -> hidden -> out, SiLU) evaluated as one batched computation: weights [K, ...].
    Trained with Adam (written out here so that its moments are plain tensors that checkpoint exactly)."""

    def __init__(self, members: int, in_dim: int, out_dim: int, hidden: int, seed: int, device: torch.device | str):
        gen = torch.Generator().manual_seed(seed)
        sizes = [(in_dim, hidden), (hidden, hidden), (hidden, out_dim)]
        self.params: list[Tensor] = []
        for fan_in, fan_out in sizes:  # nn.Linear's default initialisation, per member
            bound = 1.0 / math.sqrt(fan_in)
            self.params.append((torch.rand(members, fan_in, fan_out, generator=gen) * 2 - 1) * bound)
            self.params.append((torch.rand(members, 1, fan_out, generator=gen) * 2 - 1) * bound)
        self.params = [p.to(device) for p in self.params]
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.steps = 0

    def __call__(self, x: Tensor, params: list[Tensor] | None = None) -> Tensor:
        """[N, in] -> [K, N, out]: every member's prediction."""
        w1, b1, w2, b2, w3, b3 = self.params if params is None else params
        h = torch.nn.functional.silu(torch.matmul(x, w1) + b1)
        h = torch.nn.functional.silu(torch.bmm(h, w2) + b2)
        return torch.bmm(h, w3) + b3

    def learn(self, x: Tensor, target: Tensor, lr: float) -> float:
        """One Adam step of every member on the mean squared error of (x -> target); returns the loss before it."""
        params = [p.detach().requires_grad_(True) for p in self.params]
        loss = (self(x, params) - target).pow(2).mean(dim=(1, 2)).sum()  # each member its own mean error
        grads = torch.autograd.grad(loss, params)
        self.steps += 1
        b1, b2 = ADAM_BETAS
        correction1, correction2 = 1 - b1**self.steps, 1 - b2**self.steps
        with torch.no_grad():
            for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq, strict=True):
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                p.sub_(lr * (m / correction1) / ((v / correction2).sqrt() + ADAM_EPS))
        return float(loss.detach()) / len(self.params[0])

    def tensors(self) -> list[Tensor]:
        return [*self.params, *self.exp_avg, *self.exp_avg_sq]

    def load(self, tensors: list[Tensor], steps: int) -> None:
        n = len(self.params)
        self.params, self.exp_avg, self.exp_avg_sq = tensors[:n], tensors[n:2 * n], tensors[2 * n:]
        self.steps = steps


def disagreement(predictions: Tensor) -> Tensor:
    """[K, N, D] predictions of K members -> [N] their variance over the members, averaged over the D dimensions."""
    return predictions.var(0, unbiased=False).mean(-1)


class DisagreementBonus:
    """The env's reward plus ``scale`` x the ensemble's disagreement on each transition (module docstring)."""

    def __init__(self, env: Any, settings: DisagreementConfig):
        if "state" not in env.single_observation_space.spaces:
            raise ValueError(f"reward.shaping='disagreement' models the state observation; {type(env).__name__} observes "
                             f"{sorted(env.single_observation_space.spaces)}")
        self.env, self.settings = env, settings
        self.device = env.device
        state_dim = int(np.prod(env.single_observation_space["state"].shape))
        action_dim = int(np.prod(env.single_action_space.shape))
        self.ensemble = DynamicsEnsemble(settings.members, state_dim + action_dim, state_dim, settings.hidden,
                                         settings.seed, self.device)
        self.state_moments = RunningMoments(state_dim, self.device)
        self.change_moments = RunningMoments(state_dim, self.device)
        self.state = torch.zeros(env.num_envs, state_dim, device=self.device)
        self.wrapped_return = torch.zeros(env.num_envs, device=self.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        self.state = obs["state"].float().reshape(self.env.num_envs, -1).clone()
        self.wrapped_return.zero_()
        return obs, info

    def bonus(self, state: Tensor, action: Tensor, next_state: Tensor) -> Tensor:
        """[N] disagreement (before scaling) on the transitions (s, a, s'), then the members learn from them."""
        with torch.inference_mode(False), torch.enable_grad():  # rollouts step the env in inference mode
            state, action, next_state = state.clone(), action.float().clone(), next_state.clone()
            self.state_moments.update(state)
            self.change_moments.update(next_state - state)
            x = torch.cat([(state - self.state_moments.mean.float()) / self.state_moments.std(), action], -1)
            target = (next_state - state) / self.change_moments.std()
            with torch.no_grad():
                out = disagreement(self.ensemble(x))
            for _ in range(self.settings.updates_per_step):
                self.ensemble.learn(x, target, self.settings.lr)
        return out

    def step(self, action: Tensor):
        obs, reward, terminated, truncated, info = self.env.step(action)
        n = self.env.num_envs
        next_state = info["final_obs"]["state"].float().reshape(n, -1)
        raw = self.bonus(self.state, action.reshape(n, -1), next_state).to(reward.device)
        shaped = reward + self.settings.scale * raw
        self.wrapped_return += shaped
        info["disagreement"] = raw
        self.state = obs["state"].float().reshape(n, -1).clone()
        done = terminated | truncated
        if done.any():
            ids = info["episode"]["env_ids"]
            info["episode"] = {**info["episode"], "task_return": info["episode"]["return"],
                               "return": self.wrapped_return[ids].clone()}
            self.wrapped_return[done] = 0.0
        return obs, shaped, terminated, truncated, info

    # ------------------------------------------------------------ checkpoints
    def get_state(self) -> dict[str, Any]:
        """The wrapper's state beside the env's. Ensemble and statistics get a leading axis of 1 so that nothing of
        theirs has num_envs rows (grouped-start runners copy per-env rows between envs)."""
        state = self.env.get_state()
        ensemble = {f"disagreement.tensor.{i}": t.cpu().numpy()[None] for i, t in enumerate(self.ensemble.tensors())}
        arrays = {**state["arrays"], **ensemble, "disagreement.state": self.state.cpu().numpy(),
                  "disagreement.return": self.wrapped_return.cpu().numpy(),
                  "disagreement.steps": np.array([[self.ensemble.steps]], np.int64),
                  "disagreement.state_moments": self.state_moments.as_array()[None],
                  "disagreement.change_moments": self.change_moments.as_array()[None]}
        return {**state, "arrays": arrays}

    def set_state(self, state: dict[str, Any]) -> None:
        arrays = dict(state["arrays"])

        def take(name: str) -> np.ndarray:
            return np.asarray(arrays.pop(f"disagreement.{name}"))

        count = len(self.ensemble.tensors())
        tensors = [torch.as_tensor(take(f"tensor.{i}")[0], device=self.device).clone() for i in range(count)]
        self.ensemble.load(tensors, int(take("steps")[0, 0]))
        self.state = torch.as_tensor(take("state"), device=self.device).clone()
        self.wrapped_return = torch.as_tensor(take("return"), device=self.device).clone()
        self.state_moments.load(take("state_moments")[0])
        self.change_moments.load(take("change_moments")[0])
        self.env.set_state({**state, "arrays": arrays})


def _make_disagreement(gamma: float | None, settings: DisagreementConfig, argument: str) -> RewardFactory:
    return lambda env: DisagreementBonus(env, settings)


register_reward(RewardSpec(
    "disagreement", "an exploration bonus: the disagreement of an ensemble of dynamics models trained online on the "
    "rollouts", _make_disagreement, DisagreementConfig, "disagreement",
    state_observation="models how the state changes"))
