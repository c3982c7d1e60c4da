"""Typed run configuration; tyro turns it into the CLI and ``configs/`` holds the presets (one source of defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rlrobot.algorithms import ALGORITHMS, FLOW_ALGORITHMS
from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.algorithms.sac import SACConfig
from rlrobot.algorithms.sft import SFTConfig
from rlrobot.envs.registry import resolve_backend, validate_task_id
from rlrobot.policies.actor_critic import ActorCriticConfig
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.tasks.mujoco_vec_env import OBS_MODES, REWARD_MODES
from rlrobot.tasks.so101 import CONTROL_MODES


@dataclass
class TrainConfig:
    task: str = "so101-reach"
    """task id: a native task (so101-reach, so101-push, so101-lift) or a prefixed one (gym:Pendulum-v1)"""
    algo: str = "ppo"
    """learning algorithm: ppo | sac | sft (flow policy from demonstrations) | flow-noise | flow-sde (flow-policy PPO)"""
    num_envs: int = 256
    total_steps: int = 1_000_000
    """environment steps to train for (summed over envs)"""
    seed: int = 0
    out: str = ""
    """run directory (default: runs/<task>-<algo>-s<seed>)"""
    resume: bool = False
    """continue the run in --out from its latest checkpoint"""
    backend: str | None = None
    """simulator backend (default: the task's own): mujoco | mjwarp (native tasks on MuJoCo Warp) | gymnasium |
    maniskill | isaaclab"""
    device: str = "cpu"
    distributed: bool = False
    """data-parallel training across the processes torchrun starts (gloo on CPU, NCCL on cuda): each rank its own
    num_envs envs and seed, gradients all-reduced; total_steps counts all ranks' env steps"""
    obs_mode: str = "state"
    reward_mode: str = "dense"
    control_mode: str = "ee_delta"
    max_episode_steps: int | None = None
    num_threads: int = 0
    """simulator threads (0 = all cores)"""
    torch_threads: int = 1
    """torch intra-op threads during rollouts; 1 avoids contention with the simulator threads on small machines"""
    update_threads: int = 0
    """torch intra-op threads during PPO / SAC updates, when the simulator is idle (0 = all cores)"""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    save_replay: bool = False
    """(sac) write the replay buffer with each checkpoint so that --resume continues without a cold buffer"""
    policy: ActorCriticConfig = field(default_factory=ActorCriticConfig)
    flow: FlowPolicyConfig = field(default_factory=FlowPolicyConfig)
    """(sft, flow-noise, flow-sde) the flow-matching action-chunk policy"""
    sft: SFTConfig = field(default_factory=SFTConfig)
    flow_ppo: FlowPPOConfig = field(default_factory=FlowPPOConfig)
    dataset: str = ""
    """(sft) LeRobotDataset directory written by `rlrobot collect` (or any dataset with matching features)"""
    init: str = ""
    """(flow-noise, flow-sde) start from this SFT (or flow-RL) checkpoint: a checkpoint or run directory"""
    execute_steps: int = 0
    """(flow policies) actions of each chunk executed open-loop before re-planning (0 = the whole chunk)"""
    logger: Literal["tensorboard", "wandb", "none"] = "tensorboard"
    wandb_project: str = "rlrobot"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    checkpoint_every: int = 20
    """iterations between checkpoints"""
    eval_every: int = 25
    """iterations between evaluations (0 = only at the end)"""
    eval_episodes: int = 64
    eval_envs: int = 32
    video: bool = True
    """record an evaluation video of env 0 at the end"""
    video_episodes: int = 2

    def task_options(self) -> dict[str, Any]:
        if ":" in self.task:
            opts: dict[str, Any] = {}
            if self.max_episode_steps:
                opts["max_episode_steps"] = self.max_episode_steps
            if self.task.startswith("maniskill:"):
                opts["obs_mode"] = self.obs_mode  # ManiSkill keeps its task's own control mode
            return opts
        return {
            "obs_mode": self.obs_mode,
            "reward_mode": self.reward_mode,
            "control_mode": self.control_mode,
            "max_episode_steps": self.max_episode_steps,
            "num_threads": self.num_threads or None,
        }

    def validate(self) -> None:
        """Every bad value is reported with the field name and the allowed values, before any compute."""
        validate_task_id(self.task)
        if self.algo not in ALGORITHMS:
            raise ValueError(f"algo={self.algo!r} is not one of {ALGORITHMS}")
        resolve_backend(self.task, self.backend)
        if ":" not in self.task:
            for name, allowed in (("obs_mode", OBS_MODES), ("reward_mode", REWARD_MODES),
                                  ("control_mode", CONTROL_MODES)):
                if getattr(self, name) not in allowed:
                    raise ValueError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
            if self.obs_mode == "rgb" and self.policy.obs_key == "state" and self.algo not in FLOW_ALGORITHMS:
                raise ValueError("obs_mode='rgb' gives no 'state' observation, and the MLP actor-critic reads "
                                 "policy.obs_key='state': use obs_mode='state' or 'state+rgb'")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.algo in FLOW_ALGORITHMS:
            self.adopt_init_architecture()
            self._validate_flow()
        elif self.algo == "ppo":
            per_iteration = self.num_envs * self.ppo.num_steps
            if self.total_steps < per_iteration:
                raise ValueError(f"total_steps={self.total_steps} is less than one rollout (num_envs x ppo.num_steps = "
                                 f"{self.num_envs} x {self.ppo.num_steps} = {per_iteration})")
            if per_iteration % self.ppo.num_minibatches:
                raise ValueError(f"num_envs x ppo.num_steps = {per_iteration} must be divisible by "
                                 f"ppo.num_minibatches={self.ppo.num_minibatches}")
        else:
            self.sac.validate(self.num_envs)
            per_iteration = self.num_envs * self.sac.steps_per_iteration
            if self.total_steps < per_iteration:
                raise ValueError(f"total_steps={self.total_steps} is less than one iteration (num_envs x "
                                 f"sac.steps_per_iteration = {self.num_envs} x {self.sac.steps_per_iteration} = "
                                 f"{per_iteration})")
        if self.algo in ("flow-noise", "flow-sde"):
            per_iteration = self.steps_per_iteration()
            if self.total_steps < per_iteration:
                raise ValueError(f"total_steps={self.total_steps} is less than one rollout (num_envs x flow_ppo.num_steps "
                                 f"x execute_steps = {per_iteration})")
            if per_iteration // self.executed_steps() % self.flow_ppo.num_minibatches:
                raise ValueError(f"num_envs x flow_ppo.num_steps must be divisible by flow_ppo.num_minibatches="
                                 f"{self.flow_ppo.num_minibatches}")
        if self.eval_episodes < 1 or self.eval_envs < 1:
            raise ValueError("eval_episodes and eval_envs must be >= 1")
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be >= 1, got {self.torch_threads}")

    def _validate_flow(self) -> None:
        from pathlib import Path

        self.flow.validate()
        if self.obs_mode == "rgb" and "state" in self.flow.obs_keys:
            raise ValueError("obs_mode='rgb' gives no 'state' observation; set flow.obs_keys to image keys "
                             "(e.g. image_front image_wrist) or use obs_mode='state+rgb'")
        if not 0 <= self.execute_steps <= self.flow.chunk_size:
            raise ValueError(f"execute_steps={self.execute_steps} must be in [0, flow.chunk_size={self.flow.chunk_size}] "
                             "(0 = the whole chunk)")
        episode = self.max_episode_steps or _default_episode_steps(self.task)
        if episode and self.flow.chunk_size > episode:
            raise ValueError(f"flow.chunk_size={self.flow.chunk_size} is larger than the episode of {self.task} "
                             f"({episode} steps)")
        if self.algo == "sft":
            self.sft.validate()
            if not self.dataset:
                raise ValueError("algo='sft' needs --dataset DIR (a LeRobotDataset, e.g. from `rlrobot collect`)")
            if not (Path(self.dataset) / "meta" / "info.json").is_file():
                raise FileNotFoundError(f"dataset={self.dataset!r} is not a LeRobotDataset (no meta/info.json)")
        else:
            self.flow_ppo.validate()

    def adopt_init_architecture(self) -> None:
        """Flow-policy RL fine-tunes the ``--init`` checkpoint: its flow-policy architecture (and execute steps, unless
        given) become this run's, and a checkpoint of another policy type is refused, before any compute."""
        if self.algo not in ("flow-noise", "flow-sde") or not self.init or self.resume:
            return
        from rlrobot.runners.checkpoint import load_config

        saved = load_config(self.init)  # FileNotFoundError naming the path
        cls = saved.get("policy_class", "ActorCritic")
        if cls != "FlowPolicy":
            raise ValueError(f"init={self.init!r} holds a {cls} policy; algo={self.algo!r} fine-tunes a FlowPolicy "
                             "(train one first with --algo sft)")
        init_cfg = TrainConfig.from_dict(saved["train"])
        self.flow = init_cfg.flow
        if self.execute_steps == 0:
            self.execute_steps = init_cfg.execute_steps

    def executed_steps(self) -> int:
        """Actions executed per flow-policy chunk."""
        return self.execute_steps or self.flow.chunk_size

    def steps_per_iteration(self) -> int:
        """Env steps per runner iteration (summed over envs)."""
        if self.algo == "ppo":
            return self.num_envs * self.ppo.num_steps
        if self.algo == "sac":
            return self.num_envs * self.sac.steps_per_iteration
        if self.algo == "sft":
            return 0
        return self.num_envs * self.flow_ppo.num_steps * self.executed_steps()

    def run_dir(self) -> str:
        return self.out or f"runs/{self.task.replace(':', '_')}-{self.algo}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        d = dict(d)
        sections = {"ppo": PPOConfig, "sac": SACConfig, "policy": ActorCriticConfig, "flow": FlowPolicyConfig,
                    "sft": SFTConfig, "flow_ppo": FlowPPOConfig}
        # sections missing from older runs take their defaults; lists from JSON become the tuples they were
        built = {name: kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.pop(name, {}).items()})
                 for name, kind in sections.items()}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**built, **{k: v for k, v in d.items() if k in known})


def _default_episode_steps(task: str) -> int | None:
    if ":" in task:
        return None
    from rlrobot.tasks.so101 import TASKS

    cls = TASKS.get(task)
    return cls.default_max_episode_steps if cls is not None else None
