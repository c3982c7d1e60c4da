"""Flow-policy RL runners: chunk rollouts -> GAE over chunks -> the algorithm's update. ``FlowOnPolicyRunner``
trains Flow-Noise / Flow-SDE PPO (chain log-probs), ``FlowNFTRunner`` Flow-NFT (forward-process loss on the chunks).

One macro step executes ``flow.execute_steps`` actions of every env's chunk. Its reward is the sum of the step rewards
up to the first episode end inside the chunk; a time-out there adds gamma * V(final_obs); a chunk in which the episode
ends is ``done``. Gamma discounts once per chunk, and potential-based reward wrappers are told so
(``rlrobot.rewards.set_steps_per_discount``). (An env whose episode ends mid-chunk runs the chunk's remaining actions
in its new episode, as the batch steps in lockstep; keep ``max_episode_steps`` a multiple of ``flow.execute_steps`` so
time-outs end on a chunk boundary.) The policy is used only through the ``FlowPolicy`` protocol, so a VLA adapter trains the same way.
With ``--flow-ppo.overlap`` the next rollout is collected while the update runs (``rlrobot.runners.overlap``).
"""

from __future__ import annotations

import time

import torch

from rlrobot.algorithms.flow_nft import FlowNFT, group_advantages, step_efficiency_scores
from rlrobot.algorithms.flow_ppo import FlowPPO
from rlrobot.checkpoints import load_checkpoint
from rlrobot.config import TrainConfig
from rlrobot.curricula.execute_length import ExecuteCurriculum
from rlrobot.envs.seeds import group_start_seed
from rlrobot.envs.vec_env import POLICY_ACTED
from rlrobot.policies.registry import check_compatible
from rlrobot.rewards import set_steps_per_discount
from rlrobot.runners.base import Runner, console


class FlowOnPolicyRunner(Runner):
    cheap_env_steps = True

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.policy = self.build_policy()
        if cfg.init not in ("", "none") and not cfg.resume:
            weights, saved, _ = load_checkpoint(cfg.init)  # prepare() adopted its architecture and checked its kind
            check_compatible(saved, self.meta)
            self.policy.load_state_dict(weights)
            self.initialised_from = cfg.init
            console.print(f"initialised from {cfg.init}")
        elif not cfg.resume:
            console.print("[yellow]--init none: the flow policy starts from random weights[/]")
        self.execute_steps = self.policy.execute_steps
        set_steps_per_discount(self.env, self.execute_steps)  # potential-based rewards: gamma once per chunk
        self.obs_keys = tuple(cfg.flow.obs_keys)
        self.algo = self.make_algorithm()
        if getattr(self.section, "overlap", False):
            self.start_overlap(self.algo.storage)

    def make_algorithm(self) -> FlowPPO | FlowNFT:
        cfg = self.cfg
        return FlowPPO(self.policy, cfg.flow_ppo, cfg.spec.flow_variant, self.device, cfg.num_envs,
                       self.obs_specs(self.obs_keys), sync=self.data_parallel)

    @property
    def section(self):
        """The algorithm's config section (rollout_chunks, gamma, lam)."""
        return self.cfg.flow_ppo

    def train_iteration(self) -> dict[str, float]:
        if self.overlap is not None:
            iteration = self.iteration
            return self.overlap.iteration(self.policy, self.algo, self._rollout, lambda: self._learn_rollout(iteration),
                                          drain=self.pauses_after(iteration + 1))
        start = time.perf_counter()
        rollout_stats = self._rollout()
        rollout_time = time.perf_counter() - start
        with self.all_cores():
            update_stats = self._learn_rollout(self.iteration)
        self.algo.storage.clear()
        return {"perf/rollout_fraction": rollout_time / (time.perf_counter() - start),
                **{f"loss/{k}": v for k, v in update_stats.items()}, **rollout_stats}

    def _learn_rollout(self, iteration: int) -> dict[str, float]:
        """The update of the rollout in ``algo.storage`` (iteration ``iteration``'s)."""
        self.algo.begin_iteration(iteration, self.total_iterations)
        return self.algo.update(self.generator)

    def _rollout(self, policy=None, storage=None, generator: torch.Generator | None = None) -> dict[str, float]:
        """Collect ``rollout_chunks`` chunks per env into ``storage`` (the algorithm's), acting with ``policy`` (the
        learner) and drawing from ``generator`` (the run's)."""
        env, algo = self.env, self.algo
        policy = self.policy if policy is None else policy
        storage = algo.storage if storage is None else storage
        generator = self.generator if generator is None else generator
        section = self.section
        gamma = section.gamma
        with torch.inference_mode():
            obs = self.obs
            for _ in range(section.rollout_chunks):
                actions, fields, value = algo.rollout_act(obs, generator, policy)
                chunk_obs = {k: obs[k] for k in self.obs_keys}
                chunk_reward = torch.zeros(env.num_envs, device=self.device)
                alive = torch.ones(env.num_envs, dtype=torch.bool, device=self.device)
                learner = None  # JSRL: a chunk is the learner's when its first action was (guide chunks not credited)
                for j in range(self.execute_steps):
                    next_obs, reward, terminated, truncated, info = env.step(actions[:, j].clamp(-1.0, 1.0))
                    learner = info.get(POLICY_ACTED) if j == 0 else learner
                    chunk_reward += reward * alive
                    timeout = truncated & alive
                    if timeout.any():  # bootstrap time-outs with the value of the true final observation
                        chunk_reward += gamma * policy.value(info["final_obs"]) * timeout
                    alive &= ~(terminated | truncated)
                    self.track_episodes(info)
                    obs = next_obs
                storage.add(chunk_obs, learner, **fields, values=value, rewards=chunk_reward, dones=(~alive).float())
            last_values = policy.value(obs)
        self.obs = obs
        storage.compute_returns(last_values, gamma, section.lam)
        return {"train/value_mean": float(storage.values.mean()), "train/chunk_reward_mean": float(storage.rewards.mean())}


class FlowNFTRunner(FlowOnPolicyRunner):
    """Flow-NFT: the same chunk rollouts; the chunks (not the chains) are stored and trained on by flow matching.
    With ``--trim.curriculum`` the executed part of each chunk grows between iterations (PolicyTrim); the env-step
    budget then buys fewer, longer iterations, and the saved config carries the execute length reached."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.curriculum = ExecuteCurriculum(cfg.trim, self.execute_steps, self.policy.chunk_size) \
            if cfg.trim.curriculum else None

    def make_algorithm(self) -> FlowNFT:
        return FlowNFT(self.policy, self.cfg.flow_nft, self.device, self.cfg.num_envs, self.obs_specs(self.obs_keys),
                       sync=self.data_parallel)

    @property
    def section(self):
        return self.cfg.flow_nft

    @property
    def total_iterations(self) -> int:
        if self.curriculum is None:
            return super().total_iterations
        remaining = max(0, self.cfg.total_steps - self.env_steps)  # the iterations left at today's execute length
        return self.iteration + remaining // (self.steps_per_iteration * self.sync.world_size)

    def track_episodes(self, info) -> None:
        super().track_episodes(info)
        if self.curriculum is not None and "episode" in info:
            self.curriculum.record(info["episode"]["success"].tolist())

    def train_iteration(self) -> dict[str, float]:
        metrics = super().train_iteration()
        if self.curriculum is not None:
            new = self.curriculum.end_iteration()
            if new is not None:
                self.set_execute_steps(new)
                console.print(f"PolicyTrim: success held at {self.curriculum.history[-1]['success']:.3f}; executing "
                              f"{new} of {self.policy.chunk_size} actions per chunk from now on", soft_wrap=True)
            metrics["trim/execute_steps"] = float(self.execute_steps)
            if self.curriculum.windowed_success is not None:
                metrics["trim/windowed_success"] = self.curriculum.windowed_success
        return metrics

    def _rollout(self, policy=None, storage=None, generator: torch.Generator | None = None) -> dict[str, float]:
        if self.section.optimality == "gae":
            return super()._rollout(policy, storage, generator)
        return self._group_rollout()

    def group_starts(self) -> dict[str, torch.Tensor]:
        """Reset every env, then give each group of ``group_size`` consecutive envs its first env's start state
        (object poses, targets, physics and camera randomisation): the group's episodes differ only by the policy's
        samples, so their outcomes rank the policy's chunks (GRPO / DiffusionNFT groups)."""
        env, size = self.env, self.section.group_size
        env.reset(seed=group_start_seed(self.cfg.seed, self.sync.rank, self.iteration))
        state = env.get_state()
        leaders = torch.arange(env.num_envs).div(size, rounding_mode="floor").mul(size).numpy()
        arrays = {k: v[leaders] if getattr(v, "ndim", 0) >= 1 and v.shape[0] == env.num_envs else v
                  for k, v in state["arrays"].items()}
        env.set_state({**state, "arrays": arrays})
        return env.observe()

    def _group_rollout(self) -> dict[str, float]:
        """One whole episode per env from grouped start states; every chunk of an episode gets its group-normalised
        outcome as its advantage. Chunks after an early episode end (a new episode without an outcome) are neutral."""
        env, algo, section = self.env, self.algo, self.section
        n = env.num_envs
        scores = torch.zeros(n, device=self.device)
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        live_chunks = []
        key = "return" if section.group_score == "return" else "success_once"
        first_success = torch.zeros(n, dtype=torch.long, device=self.device)  # step of each episode's first success
        step = 0
        with torch.inference_mode():
            obs = self.group_starts()
            for _ in range(section.rollout_chunks):
                actions, fields, _ = algo.rollout_act(obs, self.generator)
                chunk_obs = {k: obs[k] for k in self.obs_keys}
                live_chunks.append(~finished)
                for j in range(self.execute_steps):
                    obs, _, _, _, info = env.step(actions[:, j].clamp(-1.0, 1.0))
                    step += 1
                    hit = info["success"].to(self.device).bool() & (first_success == 0) & ~finished
                    first_success[hit] = step
                    if "episode" in info:
                        ep = info["episode"]
                        ids = ep["env_ids"].to(self.device)
                        first = ~finished[ids]
                        scores[ids[first]] = ep[key].to(self.device, torch.float32)[first]
                        finished[ids] = True
                    self.track_episodes(info)
                zeros = torch.zeros(n, device=self.device)
                algo.storage.add(chunk_obs, **fields, values=zeros, rewards=zeros, dones=zeros)
        self.obs = obs
        if section.group_score == "success-steps":
            scores = step_efficiency_scores(scores, first_success, section.rollout_chunks * self.execute_steps,
                                            section.group_size, section.step_bonus, section.reproducible_rate)
        advantages = group_advantages(scores, section.group_size, finished)
        live = torch.stack(live_chunks)
        algo.storage.advantages = torch.where(live, advantages[None, :].expand_as(live), torch.zeros_like(live, dtype=torch.float32))
        algo.storage.returns = torch.zeros_like(algo.storage.advantages)
        return {"train/group_score_mean": float(scores[finished].mean()) if finished.any() else 0.0,
                "train/episodes_scored": float(finished.float().mean())}

    def set_execute_steps(self, execute_steps: int) -> None:
        self.execute_steps = self.policy.execute_steps = self.cfg.flow.execute_steps = execute_steps
        self.algo.set_execute_steps(execute_steps)
        set_steps_per_discount(self.env, execute_steps)

    def runner_state(self) -> dict:
        return {"curriculum": self.curriculum.state_dict()} if self.curriculum is not None else {}

    def load_runner_state(self, state: dict) -> None:
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
            self.set_execute_steps(self.curriculum.execute_steps)
