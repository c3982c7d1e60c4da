"""Typed run configuration; tyro turns it into the CLI and ``configs/`` holds the presets (one source of defaults).

``TrainConfig`` holds what every run has (task, envs, seeds, logging, evaluation, checkpoints, reward wrappers). The
config of a run is ``config_class(algo)``: ``TrainConfig`` plus the algorithm's own section (``--sac.*``), the
section of the policy kind it trains (``--policy.*`` or ``--flow.*``) and the extra inputs it declares
(``--dataset``, ``--init``), all from the algorithm registry. So ``rlrobot train --algo sac --help`` shows SAC's
options and no other algorithm's.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from typing import Any, Literal

from rlrobot.algorithms.registry import AlgorithmConfig, AlgorithmSpec, algorithm_spec
from rlrobot.checkpoints import CONFIG_VERSION, build_dataclass, upgrade_config
from rlrobot.domains import NonNegativeInt, PositiveInt, check_domains
from rlrobot.policies.registry import policy_spec
from rlrobot.rewards import RewardConfig
from rlrobot.sections import Section
from rlrobot.tasks.profile import IMAGE_PREFIX, PROFILE_OBS_MODE
from rlrobot.tasks.registry import (
    check_task_option,
    is_adapter_task,
    resolve_backend,
    task_spec,
    validate_task_id,
    validate_task_modes,
)
from rlrobot.tasks.setup import setup_text


@dataclass
class TrainConfig:
    task: str = "so101-reach"
    """task id: a native task (rlrobot list-tasks) or a prefixed one (gym:Pendulum-v1, maniskill:PushCube-v1, isaaclab:...)"""
    algo: str = "ppo"
    """learning algorithm (registered: rlrobot list-algos); `rlrobot train --algo X --help` shows X's options"""
    num_envs: PositiveInt = 256
    """parallel envs (per rank in distributed runs)"""
    total_steps: NonNegativeInt = 1_000_000
    """environment steps to train for (summed over envs and ranks)"""
    seed: NonNegativeInt = 0
    """seeds the envs, the networks' initialisation and sampling"""
    out: str = ""
    """run directory ('' = runs/<task>-<algo>-s<seed>)"""
    resume: bool = False
    """continue the run in --out from its latest checkpoint"""
    backend: Literal["mujoco", "mjwarp", "gymnasium", "maniskill", "isaaclab"] | None = None
    """simulator backend (None = the task's own; mjwarp runs the native tasks on MuJoCo Warp)"""
    device: str = "cpu"
    """torch device of the networks, rollout storage and replay (cpu, cuda, cuda:1, mps)"""
    distributed: bool = False
    """data-parallel training across the processes torchrun starts (gloo on CPU, NCCL on cuda): each rank its own
    num_envs envs and seed, gradients all-reduced; total_steps counts all ranks' env steps"""
    obs_mode: str = "state"
    """native tasks: state | rgb | state+rgb (rlrobot list-tasks shows each task's modes)"""
    reward_mode: Literal["dense", "sparse", "staged"] = "dense"
    """native tasks: the shaped dense reward, success only, or (so101-lift) ManiSkill3 PickCube's staged reward"""
    control_mode: str = "ee_delta"
    """native tasks: joint_pos | joint_delta | ee_delta"""
    max_episode_steps: PositiveInt | None = None
    """episode length in control steps (None: the task's own)"""
    servo_limits: bool = False
    """SO-101 tasks: hold the simulated joint targets to the STS3215 servos' velocity and acceleration limits, the
    deploy supervisor's defaults (with the same window), so the supervisor does not clamp the trained policy on the arm"""
    instruction: str | None = None
    """language-suite tasks (so101-suite, so101-pick-place, ...): train and evaluate on this one instruction, e.g.
    "put the red cube in the bin" (`rlrobot list-tasks --instructions TASK` lists them); None: all of the task's"""
    setup: str = ""
    """SO-101 tasks: the station's setup file (cameras, table, spawn regions, randomisation; tasks/setup.py); '' = the
    task as shipped (--obs-mode lerobot: the shipped default setup). The run keeps the setup itself: prepare() replaces
    the path by the file's contents (JSON), so a checkpoint rebuilds its scene without the file"""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """reward wrappers of the training env (--reward.shaping)"""
    num_threads: NonNegativeInt = 0
    """simulator threads (0 = all cores)"""
    torch_threads: PositiveInt = 1
    """torch intra-op threads during rollouts; 1 avoids contention with the simulator threads on small machines"""
    update_threads: NonNegativeInt = 0
    """torch intra-op threads during updates, when the simulator is idle (0 = one for a policy under 4M parameters,
    which a busy machine slows least, all cores for a larger one)"""
    logger: Literal["tensorboard", "wandb", "none"] = "tensorboard"
    """where metrics go besides metrics.jsonl"""
    wandb_project: str = "rlrobot"
    """wandb project (with --logger wandb)"""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode (offline in tests and without a login)"""
    checkpoint_every: PositiveInt = 20
    """iterations between checkpoints"""
    eval_every: NonNegativeInt | None = None
    """iterations between evaluations during training (None = ten over the run, fewer in a short run: evaluating
    stays under a fifth of the training's env steps; 0 = only at the end)"""
    eval_episodes: PositiveInt = 64
    """episodes per evaluation (deterministic policy)"""
    eval_envs: PositiveInt = 32
    """envs stepped at once during evaluation"""
    video: bool = True
    """record an evaluation video of env 0 at the end"""
    video_episodes: PositiveInt = 2
    """episodes of env 0 in the final evaluation video"""

    # ------------------------------------------------------------------ registry look-ups
    @property
    def spec(self) -> AlgorithmSpec:
        return algorithm_spec(self.algo)

    @property
    def algorithm(self) -> AlgorithmConfig:
        """This run's algorithm section (``cfg.ppo``, ``cfg.sac``, ...)."""
        return getattr(self, self.spec.config_field)

    @property
    def policy_config(self) -> Any:
        """The section of the policy kind this algorithm trains (``cfg.policy`` or ``cfg.flow``)."""
        return getattr(self, policy_spec(self.spec.policy_kind).config_field)

    def steps_per_iteration(self) -> int:
        """Env steps of one runner iteration on one rank (0 for algorithms that do not step the env)."""
        return self.algorithm.env_steps_per_iteration(self)

    def episode_steps(self) -> int | None:
        """The episode length of the task (None where the adapter decides it)."""
        if self.max_episode_steps:
            return self.max_episode_steps
        if is_adapter_task(self.task):
            return None
        return task_spec(self.task).default_max_episode_steps

    def task_options(self) -> dict[str, Any]:
        if is_adapter_task(self.task):
            opts: dict[str, Any] = {}
            if self.max_episode_steps:
                opts["max_episode_steps"] = self.max_episode_steps
            if self.task.startswith("maniskill:"):
                opts["obs_mode"] = self.obs_mode  # ManiSkill keeps its task's own control mode
            return opts
        opts = {
            "obs_mode": self.obs_mode,
            "reward_mode": self.reward_mode,
            "control_mode": self.control_mode,
            "max_episode_steps": self.max_episode_steps,
            "num_threads": self.num_threads or None,
        }
        if self.instruction is not None:  # only the suite tasks take it (validate)
            opts["instruction"] = self.instruction
        if self.servo_limits:  # only the SO-101 tasks take it (validate)
            opts["servo_limits"] = True
        if self.setup:  # only the SO-101 tasks take it (validate)
            opts["setup"] = self.setup
        return opts

    def sections(self) -> list[Section]:
        """Every config section this run holds (its algorithm's, its policy kind's, the reward's, curricula), in field
        order."""
        return [value for f in dataclasses.fields(self) if isinstance(value := getattr(self, f.name), Section)]

    def reward_wrappers(self) -> list:
        """The training env's wrappers: the reward's first, then what other sections add (JSRL's guide, outermost).
        Evaluation always reports the task's own reward in the task's own env."""
        others = [w for section in self.sections() if section is not self.reward for w in section.env_wrappers(self)]
        return [*self.reward.env_wrappers(self), *others]

    def validate(self) -> None:
        """Every bad value is reported with the field name and the allowed values, before any compute. No I/O and no
        changes to the config (``prepare`` in the algorithm does those)."""
        spec = self.spec  # an unknown algo is refused here with the registered names
        if type(self) is not config_class(self.algo):
            raise ValueError(f"algo={self.algo!r} needs its own config class (rlrobot.config.config_class({self.algo!r})); "
                             f"got {type(self).__name__}")
        check_domains(self)  # every numeric field inside its declared domain (finite, positive, a share, ...)
        validate_task_id(self.task)
        resolve_backend(self.task, self.backend)
        if not is_adapter_task(self.task):
            validate_task_modes(self.task, obs_mode=self.obs_mode, reward_mode=self.reward_mode,
                                control_mode=self.control_mode)
        for name, value in (("servo_limits", self.servo_limits or None), ("instruction", self.instruction),
                            ("setup", self.setup or None)):
            if value is not None:  # task options: the task's spec says whether it takes them and what it accepts
                check_task_option(self.task, name, value)
        for name in ("num_envs", "eval_episodes", "eval_envs", "torch_threads", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every is not None and self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0 (0 = only at the end), got {self.eval_every}")
        if self.device != "cpu":
            _check_device(self.device)
        for name in ("num_threads", "update_threads", "total_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {self.max_episode_steps}")
        for section in self.sections():
            section.validate(self)
        per_iteration = self.steps_per_iteration()
        if per_iteration and self.total_steps < per_iteration:
            raise ValueError(f"total_steps={self.total_steps} is less than one iteration of {spec.name} "
                             f"({per_iteration} env steps)")

    def prepare(self) -> None:
        """What a run does before building anything: the algorithm reads the inputs the config names (``--init``,
        ``--dataset``; its only I/O, which may adopt settings such as the ``--init`` architecture), then ``validate``."""
        check_domains(self)  # bad numbers are refused before any I/O
        for section in self.sections():
            section.prepare(self)
        profile = self.obs_mode == "lerobot" and not is_adapter_task(self.task) and "setup" in task_spec(self.task).options
        if (self.setup or profile) and not self.setup.lstrip().startswith("{"):  # the run keeps the setup itself, not a
            check_task_option(self.task, "setup", self.setup)  # path to it (the profile: the shipped default's too)
            self.setup = setup_text(self.setup)
        self.validate()

    def unread_cameras_note(self) -> str | None:
        """A line for the run's header when the env renders cameras that the policy never reads (rendering costs most
        of a step); None otherwise."""
        renders = "rgb" in self.obs_mode or self.obs_mode == PROFILE_OBS_MODE
        keys = self.policy_config.observation_keys(self) if renders else None
        if keys is None or any(k.startswith(IMAGE_PREFIX) for k in keys):
            return None
        return (f"obs_mode={self.obs_mode!r} renders camera images that the {self.spec.policy_kind} policy does not read "
                f"(it reads {list(keys)}): --obs-mode state steps several times faster")

    def run_dir(self) -> str:
        return self.out or f"runs/{self.task.replace(':', '_')}-{self.algo}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        return {"config_version": CONFIG_VERSION, **dataclasses.asdict(self)}


def _check_device(device: str) -> None:
    """A device this torch build can use, or a one-line error saying why not (before any env is built)."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device={device!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU is visible"
        raise ValueError(f"device={device!r}: this torch ({torch.__version__}) is {build}; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: MPS is not available on this machine; use --device cpu")


@functools.cache
def config_class(algo: str) -> type[TrainConfig]:
    """The run config of one algorithm: the common fields, its section, its policy kind's section, its inputs."""
    spec = algorithm_spec(algo)
    policy = policy_spec(spec.policy_kind)
    fields = [("algo", str, field(default=spec.name)),
              (spec.config_field, spec.config, field(default_factory=spec.config)),
              (policy.config_field, policy.config, field(default_factory=policy.config))]
    name = "TrainConfig_" + spec.name.replace("-", "_")
    # mixins first in the bases: dataclass fields follow the reversed MRO, so the common fields come first in --help
    cls = dataclasses.make_dataclass(name, fields, bases=(*spec.run_fields, TrainConfig))
    cls.__module__ = __name__
    cls.__doc__ = f"Train with {spec.name}: {spec.summary}."
    setattr(sys.modules[__name__], name, cls)  # importable by name (pickle, copy)
    return cls


def train_config(algo: str = "ppo", **fields: Any) -> TrainConfig:
    """A run config for ``algo`` (what presets call): ``train_config("sac", task="so101-push", sac=SACConfig(...))``."""
    return config_class(algo)(**fields)


def config_from_dict(train: dict[str, Any]) -> TrainConfig:
    """The run config saved in a checkpoint's config.json (``train``), of any config version this code reads."""
    train = upgrade_config(train)
    return build_dataclass(config_class(train.get("algo", "ppo")),
                           {k: v for k, v in train.items() if k != "config_version"}, strict=False)


def config_from_checkpoint(saved: dict[str, Any]) -> TrainConfig:
    """The run config of a checkpoint's config.json contents."""
    return config_from_dict(saved["train"])
