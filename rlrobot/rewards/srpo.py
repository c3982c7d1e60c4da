"""SRPO latent progress (Self-Referential Policy Optimization): reward a failed trajectory by how close its latent
embedding comes to the successes of the same task, with no external reward model.

Symbols (ALGORITHMS.md, "Process reward models"):
  e_i        trajectory embedding: the mean over the episode's frames of a per-frame feature f(o_t). f is the PRM's
             encoder when one is given (``features=``), else the *standardised state*: (o_t["state"] - mu) / sigma with
             mu, sigma per state dimension over the frames at hand (the rollout batch, or a running estimate in the
             per-step wrapper). Standardising keeps metres, radians and rad/s on one scale, so no single joint
             velocity dominates the distance.
  task group the rollouts with the same instruction; successes get r = 1.
  centres    the successes' embeddings clustered per task group (DBSCAN with eps = ``eps_scale`` x the median pairwise
             success distance and min_samples 2; each cluster's mean is a centre and a success DBSCAN calls noise is a
             centre of its own, since it is still a success), or just their mean (``cluster="mean"``).
  d_i        a failure's distance to its nearest success centre; d_hat min-max normalised over the group's failures
             (0.5 when they are all equally far: a lone failure gets the sigmoid's midpoint).
  r_i        = fail_scale * sigmoid(temperature * (0.5 - d_hat)) = 0.6 * sigmoid(10 * (0.5 - d_hat)): in (0.004, 0.596),
             always below a success's 1. A failure in a group with no success has no reference and gets 0.
  advantage  GRPO within each group of rollouts from one start state (and so one instruction): (r - mean_g) / std_g,
             only for groups whose success rate is in [low, high] = [0.1, 0.9] (the SRPO group filter); the others
             get 0 (they carry no ranking between success and failure).

Two users: ``FlowSRPORunner`` (``--algo flow-srpo``) applies it batch-wise to groups of whole episodes, and
``SRPOReward`` (``--reward.shaping srpo``, settings ``--reward.srpo.*``) adapts it to per-step learners (PPO, SAC,
flow-policy PPO) as a trajectory reward added at each episode's last step, against a memory of *recent* successes of
the same instruction (the per-step learners do not roll out groups).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from rlrobot.domains import Positive, PositiveInt
from rlrobot.rewards.registry import RewardFactory, RewardSpec, register_reward
from rlrobot.sections import Section

CLUSTERS = ("dbscan", "mean")


@dataclass
class SRPOSettings:
    fail_scale: float = 0.6
    """a failure's reward is at most this (SRPO: 0.6), below a success's 1"""
    temperature: float = 10.0
    """sharpness of the sigmoid over the normalised distance (SRPO: 10)"""
    low: float = 0.1
    """group filter: keep groups whose success rate is >= low ..."""
    high: float = 0.9
    """... and <= high (SRPO: [0.1, 0.9])"""
    cluster: Literal["dbscan", "mean"] = "dbscan"
    """success centres per task group: dbscan clusters (their means) | mean of all successes"""
    eps_scale: float = 0.5
    """(dbscan) eps = eps_scale x the median pairwise distance between the group's successes"""

    def validate(self, prefix: str) -> None:
        if self.cluster not in CLUSTERS:
            raise ValueError(f"{prefix}.cluster={self.cluster!r} is not one of {CLUSTERS}")
        if not 0.0 < self.fail_scale < 1.0:
            raise ValueError(f"{prefix}.fail_scale must be in (0, 1) (below a success's reward 1), got {self.fail_scale}")
        if self.temperature <= 0 or self.eps_scale <= 0:
            raise ValueError(f"{prefix}.temperature and {prefix}.eps_scale must be > 0, got {self.temperature} and "
                             f"{self.eps_scale}")
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"{prefix}.low / high must satisfy 0 <= low <= high <= 1, got {self.low} / {self.high}")


# ---------------------------------------------------------------------------------------------- embeddings
def trajectory_embeddings(frames: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Frames [T, N, D] and which of them belong to the episode [T, N] -> the mean frame of each episode [N, D]."""
    w = valid.to(frames.dtype)
    return (frames * w[..., None]).sum(0) / w.sum(0).clamp_min(1.0)[:, None]


def standardise(frames: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Frames [T, N, D] -> (frames - mu) / sigma with mu, sigma per dimension over the valid frames (sigma floored)."""
    x = frames[valid]
    mu, sigma = x.mean(0), x.std(0, unbiased=False).clamp_min(1e-3)
    return (frames - mu) / sigma


def state_features(obs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The default per-frame feature: the flat state observation (standardised later, over the frames at hand)."""
    if "state" not in obs:
        raise ValueError(f"SRPO's default embedding reads the 'state' observation; this env observes {sorted(obs)} "
                         "(use --obs-mode state or state+rgb, or give a PRM encoder)")
    return obs["state"].float().reshape(len(obs["state"]), -1)


# ---------------------------------------------------------------------------------------------- clusters
def dbscan_labels(x: torch.Tensor, eps: float, min_samples: int = 2) -> torch.Tensor:
    """DBSCAN on a few points [S, D]: cluster ids >= 0, -1 for noise. Core points have >= min_samples neighbours
    within eps (themselves included); clusters are the connected components of core points; a border point joins the
    cluster of its first core neighbour."""
    s = len(x)
    near = torch.cdist(x, x) <= eps
    core = near.sum(1) >= min_samples
    labels = torch.where(core, torch.arange(s, device=x.device), torch.full((s,), s, device=x.device))
    link = near & core[:, None] & core[None, :]
    for _ in range(s):  # min-label propagation over core links until it settles (<= S rounds)
        spread = torch.where(link, labels[None, :], torch.full_like(link, s, dtype=labels.dtype)).min(1).values
        new = torch.where(core, torch.minimum(labels, spread), labels)
        if torch.equal(new, labels):
            break
        labels = new
    border = ~core & (near & core[None, :]).any(1)
    if border.any():
        first_core = torch.where(near & core[None, :], torch.arange(s, device=x.device)[None, :], s).min(1).values
        labels = torch.where(border, labels[first_core.clamp_max(s - 1)], labels)
    labels = torch.where(labels >= s, torch.full_like(labels, -1), labels)
    _, dense = torch.unique(labels, return_inverse=True)  # renumber 0.. (noise, if any, becomes 0: shift below)
    return torch.where(labels < 0, -1, dense - int((labels < 0).any()))


def success_centres(emb: torch.Tensor, cluster: str = "dbscan", eps_scale: float = 0.5) -> torch.Tensor:
    """Success embeddings [S, D] of one task group -> centres [C, D] (see the module's docstring)."""
    if cluster == "mean" or len(emb) < 3:
        return emb.mean(0, keepdim=True)
    dist = torch.cdist(emb, emb)
    pairs = dist[torch.triu(torch.ones_like(dist, dtype=torch.bool), 1)]
    eps = float(pairs.median()) * eps_scale
    if eps <= 0:
        return emb.mean(0, keepdim=True)
    labels = dbscan_labels(emb, eps)
    centres = [emb[labels == c].mean(0) for c in range(int(labels.max()) + 1)] if (labels >= 0).any() else []
    centres += list(emb[labels < 0])  # noise successes are their own references
    return torch.stack(centres)


# ---------------------------------------------------------------------------------------------- rewards, advantages
def failure_rewards(distance: torch.Tensor, fail_scale: float = 0.6, temperature: float = 10.0,
                    reference: torch.Tensor | None = None) -> torch.Tensor:
    """Distances of failures to their nearest success centre [F] -> fail_scale * sigmoid(temperature * (0.5 - d_hat)),
    d_hat min-max normalised over ``reference`` (default: the failures themselves); 0.5 when the range is empty."""
    ref = distance if reference is None else reference
    lo, hi = ref.min(), ref.max()
    span = hi - lo
    d_hat = ((distance - lo) / span).clamp(0.0, 1.0) if float(span) > 1e-12 else torch.full_like(distance, 0.5)
    return fail_scale * torch.sigmoid(temperature * (0.5 - d_hat))


def srpo_rewards(emb: torch.Tensor, success: torch.Tensor, task: torch.Tensor,
                 settings: SRPOSettings | None = None) -> torch.Tensor:
    """Trajectory embeddings [N, D], success [N], task-group ids [N] (one per instruction) -> rewards [N]: 1 for a
    success, 0.6 sigmoid(10 (0.5 - d_hat)) for a failure of a task group with successes, 0 for one without."""
    s = settings or SRPOSettings()
    success = success.bool()
    rewards = success.float()
    for g in torch.unique(task).tolist():  # one pass per instruction in the batch (a handful), not per env
        in_group = task == g
        succ, fail = in_group & success, in_group & ~success
        if not succ.any() or not fail.any():
            continue
        centres = success_centres(emb[succ], s.cluster, s.eps_scale)
        d = torch.cdist(emb[fail], centres).min(1).values
        rewards[fail] = failure_rewards(d, s.fail_scale, s.temperature)
    return rewards


def group_filter(success: torch.Tensor, group_size: int, low: float = 0.1, high: float = 0.9) -> torch.Tensor:
    """Envs in consecutive groups of ``group_size`` -> [N] True where the env's group has a success rate in [low,
    high]."""
    rate = success.float().reshape(-1, group_size).mean(1)
    keep = (rate >= low - 1e-9) & (rate <= high + 1e-9)
    return keep.repeat_interleave(group_size)


def srpo_advantages(rewards: torch.Tensor, group_size: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """GRPO: (r - mean_g) / std_g within each group of ``group_size`` consecutive envs; 0 where ``keep`` is False."""
    grouped = rewards.reshape(-1, group_size)
    adv = (grouped - grouped.mean(1, keepdim=True)) / grouped.std(1, unbiased=False, keepdim=True).clamp_min(1e-6)
    adv = adv.reshape(-1)
    return adv if keep is None else torch.where(keep, adv, torch.zeros_like(adv))


def instruction_ids(texts: list[str], device: torch.device | str = "cpu") -> torch.Tensor:
    """A stable int64 id per instruction string (CRC-32): task groups as a tensor, and checkpointable."""
    return torch.tensor([zlib.crc32(t.encode()) for t in texts], dtype=torch.int64, device=device)


# ---------------------------------------------------------------------------------------------- per-step wrapper
class SRPOReward:
    """``--reward.shaping srpo`` for per-step learners: the env's reward, plus at each episode's last step the SRPO
    trajectory reward of that episode (``scale`` x: 1 for a success; for a failure 0.6 sigmoid(10 (0.5 - d_hat)) with
    d its embedding's distance to the nearest centre of the last ``memory`` successes of the same instruction and
    d_hat min-max normalised over the last ``memory`` failures' distances of that instruction; 0 before the
    instruction has any success). Use it with ``--reward-mode sparse`` for SRPO proper (success plus latent progress).

    Embeddings: the mean over the episode's frames (first observation, then every post-step one: ``final_obs`` at the
    end) of ``features(obs)`` (default: the state), compared after standardising with a running mean / std of all
    frames seen (the memory keeps raw means: standardisation is affine, so the mean of the standardised frames is the
    standardised mean and old entries stay comparable).
    """

    def __init__(self, env: Any, settings: SRPOSettings | None = None, scale: float = 1.0, memory: int = 64,
                 features: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None):
        try:
            env.instruction  # noqa: B018  (a property: raises where the task has none)
        except (NotImplementedError, AttributeError) as e:
            raise ValueError(f"reward.shaping='srpo' groups episodes by instruction; {type(env).__name__} has none") from e
        self.env, self.settings, self.scale, self.memory = env, settings or SRPOSettings(), float(scale), int(memory)
        self.features = features or state_features
        self.device = env.device
        n = env.num_envs
        self.dim = 0
        self.sums = torch.zeros(n, 0, device=self.device)
        self.counts = torch.zeros(n, device=self.device)
        self.wrapped_return = torch.zeros(n, device=self.device)
        self.stat_count = torch.zeros((), device=self.device, dtype=torch.float64)
        self.stat_mean = torch.zeros(0, device=self.device, dtype=torch.float64)
        self.stat_m2 = torch.zeros(0, device=self.device, dtype=torch.float64)
        # memories: (instruction id, raw mean embedding) of recent successes; (instruction id, distance) of failures
        self.succ_key = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.succ_emb = torch.zeros(0, 0, device=self.device)
        self.fail_key = torch.zeros(0, dtype=torch.int64, device=self.device)
        self.fail_dist = torch.zeros(0, device=self.device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    # ------------------------------------------------------------ frames
    def _frames(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        f = self.features(obs).float()
        if self.dim == 0:  # the first frame fixes the feature size
            self.dim = f.shape[-1]
            self.sums = torch.zeros(self.env.num_envs, self.dim, device=self.device)
            self.stat_mean = torch.zeros(self.dim, device=self.device, dtype=torch.float64)
            self.stat_m2 = torch.zeros(self.dim, device=self.device, dtype=torch.float64)
            self.succ_emb = torch.zeros(0, self.dim, device=self.device)
        x = f.double()  # Chan et al.'s batched update of the running mean / variance
        n_b, mean_b = float(len(x)), x.mean(0)
        delta = mean_b - self.stat_mean
        total = self.stat_count + n_b
        self.stat_mean = self.stat_mean + delta * n_b / total
        self.stat_m2 = self.stat_m2 + ((x - mean_b) ** 2).sum(0) + delta**2 * self.stat_count * n_b / total
        self.stat_count = total
        return f

    def _sigma(self) -> torch.Tensor:
        return (self.stat_m2 / self.stat_count.clamp_min(1.0)).sqrt().clamp_min(1e-3).float()

    def reset(self, seed: int | None = None):
        obs, info = self.env.reset(seed=seed)
        f = self._frames(obs)
        self.sums = f.clone()
        self.counts = torch.ones(self.env.num_envs, device=self.device)
        self.wrapped_return.zero_()
        return obs, info

    # ------------------------------------------------------------ step
    def step(self, action: torch.Tensor):
        instructions = list(self.env.instruction)  # the episode's own (suite tasks redraw them at autoreset)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.sums += self._frames(info["final_obs"])
        self.counts += 1
        done = terminated | truncated
        bonus = torch.zeros_like(reward)
        if done.any():
            ids = info["episode"]["env_ids"]
            emb = self.sums[ids] / self.counts[ids, None]
            keys = instruction_ids([instructions[i] for i in ids.tolist()], self.device)
            srpo = self.episode_rewards(emb, info["episode"]["success"].bool(), keys)
            bonus[ids] = self.scale * srpo
            first = self._frames(obs)[done]  # the new episodes' first frames (stats count them once more; harmless)
            self.sums[done] = first
            self.counts[done] = 1.0
        shaped = reward + bonus
        self.wrapped_return += shaped
        if done.any():
            ids = info["episode"]["env_ids"]
            info["episode"] = {**info["episode"], "task_return": info["episode"]["return"],
                               "return": self.wrapped_return[ids].clone(), "srpo_reward": srpo}
            self.wrapped_return[done] = 0.0
        return obs, shaped, terminated, truncated, info

    def episode_rewards(self, emb: torch.Tensor, success: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """SRPO rewards of finished episodes against the memories; then the memories take them in."""
        s, sigma = self.settings, self._sigma()
        out = success.float()
        fail_ids = (~success).nonzero().flatten().tolist()
        for i in fail_ids:
            ref = self.succ_emb[self.succ_key == keys[i]]
            if not len(ref):
                continue
            centres = success_centres(ref / sigma, s.cluster, s.eps_scale)
            d = torch.cdist((emb[i] / sigma)[None], centres).min()
            past = self.fail_dist[self.fail_key == keys[i]]
            out[i] = failure_rewards(d[None], s.fail_scale, s.temperature, torch.cat([past, d[None]]))[0]
            self.fail_key = torch.cat([self.fail_key, keys[i:i + 1]])
            self.fail_dist = torch.cat([self.fail_dist, d[None]])
        if success.any():
            self.succ_key = torch.cat([self.succ_key, keys[success]])
            self.succ_emb = torch.cat([self.succ_emb, emb[success]])
        self.succ_key, self.succ_emb = _keep_recent(self.succ_key, self.succ_emb, self.memory)
        self.fail_key, self.fail_dist = _keep_recent(self.fail_key, self.fail_dist, self.memory)
        return out

    # ------------------------------------------------------------ checkpoints
    def get_state(self) -> dict[str, Any]:
        """The wrapper's state beside the env's. Memories get a leading axis of 1 so that nothing of theirs has
        num_envs rows (grouped-start runners copy per-env rows between envs)."""
        state = self.env.get_state()
        arrays = {**state["arrays"], "srpo.sums": self.sums.cpu().numpy(), "srpo.counts": self.counts.cpu().numpy(),
                  "srpo.return": self.wrapped_return.cpu().numpy(),
                  "srpo.stats": torch.cat([self.stat_count[None], self.stat_mean, self.stat_m2]).cpu().numpy()[None],
                  "srpo.succ_key": self.succ_key.cpu().numpy()[None], "srpo.succ_emb": self.succ_emb.cpu().numpy()[None],
                  "srpo.fail_key": self.fail_key.cpu().numpy()[None], "srpo.fail_dist": self.fail_dist.cpu().numpy()[None]}
        return {**state, "arrays": arrays}

    def set_state(self, state: dict[str, Any]) -> None:
        arrays = dict(state["arrays"])

        def take(name: str, dtype=None) -> torch.Tensor:
            return torch.as_tensor(np.asarray(arrays.pop(f"srpo.{name}")), device=self.device, dtype=dtype).clone()

        self.sums, self.counts, self.wrapped_return = take("sums"), take("counts"), take("return")
        self.dim = self.sums.shape[-1]
        stats = take("stats", torch.float64)[0]
        self.stat_count, self.stat_mean, self.stat_m2 = stats[0], stats[1:1 + self.dim], stats[1 + self.dim:]
        self.succ_key, self.succ_emb = take("succ_key")[0], take("succ_emb")[0]
        self.fail_key, self.fail_dist = take("fail_key")[0], take("fail_dist")[0]
        self.env.set_state({**state, "arrays": arrays})


def _keep_recent(keys: torch.Tensor, values: torch.Tensor, per_key: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The newest ``per_key`` entries of each key (entries are in arrival order)."""
    if not len(keys):
        return keys, values
    newest_first = torch.arange(len(keys) - 1, -1, -1, device=keys.device)
    k = keys[newest_first]
    rank = torch.zeros_like(k)
    for key in torch.unique(k).tolist():
        m = k == key
        rank[m] = torch.arange(int(m.sum()), device=keys.device)
    keep = (rank < per_key)[newest_first]  # back to arrival order
    return keys[keep], values[keep]


@dataclass
class SRPORewardConfig(Section):
    """``--reward.srpo.*``: the per-step learners' SRPO trajectory reward."""

    scale: Positive = 1.0
    """weight of the trajectory reward (1 for a success, < 0.6 for a failure)"""
    memory: PositiveInt = 64
    """recent successes (and failure distances) kept per instruction as the reference"""

    def validate(self, run: Any) -> None:
        if not self.scale > 0:
            raise ValueError(f"reward.srpo.scale must be > 0, got {self.scale}")
        if self.memory < 1:
            raise ValueError(f"reward.srpo.memory must be >= 1, got {self.memory}")


def _make_srpo(gamma: float | None, settings: SRPORewardConfig, argument: str) -> RewardFactory:
    return lambda env: SRPOReward(env, scale=settings.scale, memory=settings.memory)


register_reward(RewardSpec(
    "srpo", "SRPO latent progress: a trajectory reward at each episode's end against recent successes of its "
    "instruction", _make_srpo, SRPORewardConfig, "srpo", native_task="instructions and success per episode",
    state_observation="embeds episodes by their state"))
