"""What every offline RL algorithm shares: its config base, its learner base, the look-up the offline
runner uses, the policy kind its checkpoints load as, and the losses and networks several algorithms reuse.

Adding an offline algorithm (BC, IQL, Cal-QL, FQL, RQL, ...) is one module in ``rlrobot/algorithms/``:

    @dataclass
    class IQLConfig(OfflineConfig):          # its own fields; validate() calls super().validate(run) first
        expectile: float = 0.7

    class IQL(OfflineAlgorithm):
        def __init__(self, cfg, obs_dim, action_dim, data, device, generator): ...   # networks into self.networks
        def update(self) -> dict[str, float]: ...   # ONE gradient step on a batch it samples from self.data
        def act(self, obs, deterministic=True): ...  # [N, A] in [-1, 1] (or [N, h, A] if chunk_size = h > 1)

    register_algorithm(offline_spec("iql", "implicit Q-learning ...", IQLConfig, IQL))   # the spec names the learner

plus its import line in ``rlrobot/algorithms/__init__.py``, presets ``configs/iql_<task>.py`` and tests.

Contract with the runner (``rlrobot.runners.offline.OfflineRunner``):

- The spec's ``learner`` is the class the runner builds; its ``needs_rewards`` and ``sac_compatible`` say what it
  trains on and whether a warm start can continue from it.
- ``data`` is a ``rlrobot.data.transitions.Transitions`` on ``device`` (None when a checkpoint is only loaded to act:
  ``rlrobot eval``, ``serve``, ``deploy``), ``generator`` a ``torch.Generator`` on ``device`` for batches and noise.
- Every network (observation normaliser, target networks and EMA copies included) lives in ``self.networks`` (an
  ``nn.ModuleDict``): the runner checkpoints ``self.policy`` (an ``OfflinePolicy`` holding them) as the weights.
  ``state_dict`` holds the rest (optimizers, counters); ``load_state_dict`` restores it.
- Observations are normalised inside the algorithm: ``self.normalize(obs)`` with mean / std fitted from the data
  (``self.networks["obs_norm"]``, saved with the weights).
- ``chunk_size`` > 1 (action-chunking actors, e.g. RQL's h): ``act`` returns [N, h, A], evaluation runs each chunk
  open-loop for ``--offline-policy.execute-steps`` actions (0 = the whole chunk), then re-plans.
- The runner calls ``update()`` ``updates_per_iteration`` times per iteration, ``gradient_steps`` in all.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

import torch
from torch import nn

from rlrobot.algorithms.registry import ALGORITHMS, AlgorithmConfig, AlgorithmSpec, algorithm_spec
from rlrobot.algorithms.sft import DatasetInput, adopt_scaled_budget
from rlrobot.checkpoints import load_section, saved_train
from rlrobot.domains import Domain, NonNegativeInt, Positive, PositiveInt, PositiveUnit, UnitInterval
from rlrobot.policies.normalizer import RunningNormalizer
from rlrobot.policies.registry import PolicySpec, register_policy
from rlrobot.sections import Section
from rlrobot.tasks.profile import PROFILE_OBS_MODE
from rlrobot.tasks.registry import is_adapter_task

if TYPE_CHECKING:
    from rlrobot.data.transitions import Transitions

OFFLINE_RUNNER = "rlrobot.runners.offline:OfflineRunner"
OFFLINE_POLICY_KIND = "offline"
PROBE_SIZE, PROBE_SEED = 2048, 20_221_015
"""the workflow diagnostics' fixed transitions: how many, and the seed of their own generator"""


@dataclass
class SemiSupervisedInput:
    labelled_fraction: PositiveUnit = 1.0
    """share of the dataset's episodes whose actions are kept (semi-supervised offline RL): the others lose their
    actions, an inverse-dynamics model trained on the kept ones labels them, the algorithm trains on the union
    (1.0 = every action as recorded)"""
    inverse_dynamics_steps: PositiveInt = 1000
    """gradient steps of the inverse-dynamics model (with --labelled-fraction below 1; a 128x128 MLP: on so101-push
    noisy with 10 % labelled its relabelling error was the same after 1,000 steps as after 3,000 with 256x256)"""


@dataclass
class OfflineConfig(AlgorithmConfig):
    """Base section of every offline algorithm (subclasses add their own fields and call ``super().validate``)."""

    budget_field: ClassVar[str | None] = "gradient_steps"
    gradient_steps: PositiveInt | None = None
    """the budget: gradient steps in all (each update() is one); None: the task's preset's, or where the task has
    none, scaled to the dataset (rlrobot.data.transitions.scaled_budget: 50 passes, 2,000 to 100,000 steps)"""
    batch_size: PositiveInt = 256
    """transitions (or h-step windows) per gradient step"""
    updates_per_iteration: PositiveInt = 1000
    """gradient steps between log lines (one runner iteration); evaluations and checkpoints fall on iterations"""
    hidden: tuple[PositiveInt, ...] = (256, 256)
    """hidden layer sizes of the MLPs (CPU presets use smaller ones than the papers)"""
    lr: Positive = 3e-4
    """Adam learning rate"""
    gamma: UnitInterval = 0.99
    """discount"""
    max_episodes: NonNegativeInt = 0
    """use only the first N episodes of the dataset (0 = all)"""
    holdout_fraction: Annotated[float, Domain(0.0, 1.0, high_open=True)] = 0.0
    """share of the dataset's episodes (the last ones) kept out of training: the workflow diagnostics report the TD
    error on them beside the training one (``rlrobot offline-check``); 0 = train on every episode"""

    def validate(self, run) -> None:
        name = run.spec.config_field
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"{name}.holdout_fraction must be in [0, 1) (share of episodes held out), got {self.holdout_fraction}")
        if self.holdout_fraction > 0 and not logs_workflow_metrics(run.spec.learner):
            raise ValueError(f"{name}.holdout_fraction must be 0 for algo={run.spec.name!r} (no critic on the dataset's actions "
                             f"to diagnose); the algorithms that log the workflow metrics: {', '.join(workflow_algorithm_names())}")
        for field in ("batch_size", "updates_per_iteration"):
            if getattr(self, field) < 1:
                raise ValueError(f"{name}.{field} must be >= 1, got {getattr(self, field)}")
        if self.max_episodes < 0:
            raise ValueError(f"{name}.max_episodes must be >= 0 (0 = all), got {self.max_episodes}")
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise ValueError(f"{name}.hidden must be one or more sizes >= 1, got {self.hidden}")
        if self.lr <= 0:
            raise ValueError(f"{name}.lr must be > 0, got {self.lr}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"{name}.gamma must be in (0, 1], got {self.gamma}")
        if not run.dataset:
            raise ValueError(f"algo={run.algo!r} needs --dataset DIR (a LeRobotDataset, e.g. from `rlrobot collect --recipe`)")
        fraction = getattr(run, "labelled_fraction", 1.0)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"labelled_fraction must be in (0, 1] (share of episodes that keep their actions), got {fraction}")
        if getattr(run, "inverse_dynamics_steps", 1) < 1:
            raise ValueError(f"inverse_dynamics_steps must be >= 1, got {run.inverse_dynamics_steps}")
        if not is_adapter_task(run.task) and run.obs_mode != PROFILE_OBS_MODE and "state" not in run.obs_mode.split("+"):
            raise ValueError(f"algo={run.algo!r} trains on state observations; obs_mode={run.obs_mode!r} has none "
                             f"(use state, state+rgb or {PROFILE_OBS_MODE}, whose state is the six joint readings)")

    def env_steps_per_iteration(self, run) -> int:
        return 0  # learns from the dataset; the env is only evaluated

    def prepare(self, run) -> None:
        from pathlib import Path

        if run.dataset and not (Path(run.dataset) / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"dataset={run.dataset!r} is not a LeRobotDataset (no meta/info.json)")
        if self.gradient_steps is None and run.dataset:
            self.gradient_steps = adopt_scaled_budget(run, self.batch_size)


# ---------------------------------------------------------------------- the spec of an offline algorithm
def offline_algorithm_names() -> tuple[str, ...]:
    """The registered algorithms the offline runner trains (their policies are the ``offline`` kind)."""
    return tuple(spec.name for spec in ALGORITHMS.specs() if spec.policy_kind == OFFLINE_POLICY_KIND)


def workflow_algorithm_names() -> tuple[str, ...]:
    """The offline algorithms that log the workflow metrics (a critic on the dataset's actions: ``q_and_target``)."""
    return tuple(spec.name for spec in ALGORITHMS.specs()
                 if spec.policy_kind == OFFLINE_POLICY_KIND and logs_workflow_metrics(spec.learner))


def offline_spec(name: str, summary: str, config: type[OfflineConfig], learner: type[OfflineAlgorithm],
                 **capabilities: Any) -> AlgorithmSpec:
    """The ``AlgorithmSpec`` of an offline algorithm: the offline runner builds ``learner``; the ``offline`` policy kind,
    ``--dataset`` and ``--labelled-fraction``; ``capabilities`` (``needs_rewards``, ``sac_compatible``) as the spec's."""
    return AlgorithmSpec(name=name, summary=summary, config_field=name.replace("-", "_"), config=config,
                         policy_kind=OFFLINE_POLICY_KIND, runner=OFFLINE_RUNNER, run_fields=(DatasetInput, SemiSupervisedInput),
                         learner=learner, **capabilities)


# ---------------------------------------------------------------------- the learner base
class OfflineAlgorithm(abc.ABC):
    """Owns its networks (``self.networks``), optimizers (``self.optimizers``) and state; see the module docstring."""

    name: str = ""
    chunk_size: int = 1
    """actions per act() call (1: [N, A]; h > 1: [N, h, A], executed open-loop)"""

    def __init__(self, cfg: OfflineConfig, obs_dim: int, action_dim: int, data: Transitions | None,
                 device: torch.device | str, generator: torch.Generator | None = None):
        self.cfg, self.obs_dim, self.action_dim, self.data = cfg, obs_dim, action_dim, data
        self.device = torch.device(device)
        self.generator = generator if generator is not None else torch.Generator(device=self.device).manual_seed(0)
        self.networks = nn.ModuleDict()
        self.networks["obs_norm"] = RunningNormalizer(obs_dim).to(self.device)
        self.holdout: Transitions | None = None
        if data is not None:
            if len(data) == 0:
                raise ValueError("the dataset holds no transitions")
            if getattr(cfg, "holdout_fraction", 0.0) > 0:  # before the normaliser: held-out states stay unseen
                self.data, self.holdout = split_episodes(data, cfg.holdout_fraction)
            self.networks["obs_norm"].update(self.data.obs["state"].float())
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.updates = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """``self.updates`` counts finished ``update()`` calls: each subclass's ``update`` is wrapped to count once
        (a subclass calling ``super().update()`` is still counted once), so no algorithm has to remember it."""
        super().__init_subclass__(**kwargs)
        inner = cls.__dict__.get("update")
        if inner is None or getattr(inner, "_counts_updates", False):
            return

        @functools.wraps(inner)
        def update(self) -> dict[str, float]:
            outer = not getattr(self, "_in_update", False)
            self._in_update = True
            try:
                out = inner(self)
            finally:
                if outer:
                    self._in_update = False
            if outer:
                self.updates += 1
            return out

        update._counts_updates = True
        cls.update = update

    # ------------------------------------------------------------------ what each algorithm implements
    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """One gradient step on a batch sampled from ``self.data`` with ``self.generator``; returns losses to log
        (floats: ``as_float`` makes them with one host sync). ``self.updates`` is counted for it (see above)."""

    @abc.abstractmethod
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        """Actions in [-1, 1]: [N, A] (or [N, chunk_size, A])."""

    def q_and_target(self, batch: Transitions) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Q(s, a) of the batch's own actions and the TD target the critics are fitted to, both [B], for the offline-RL
        workflow's diagnostics (``workflow_metrics``); None for an algorithm without one (BC, RQL's values of action chunks,
        ReCOIL's reward-free critic)."""
        return None

    # ------------------------------------------------------------------ shared
    @torch.no_grad()
    def workflow_metrics(self) -> dict[str, float]:
        """The training-time diagnostics of Kumar et al.'s offline-RL workflow, on fixed probe transitions (drawn once,
        apart from the training stream): ``q_data``, the mean Q of the dataset's own actions (its trend tells
        overfitting: conservative critics push it down once they overfit); ``td_train``, the mean squared TD error
        over the variance of the TD targets (1 - R^2 of the critic's fit: high when it underfits); ``td_holdout``, the
        same on held-out episodes (``holdout_fraction``; rising while ``td_train`` falls when it overfits)."""
        if self.data is None:
            return {}
        if not hasattr(self, "_probes"):
            probe = torch.Generator(device=self.device).manual_seed(PROBE_SEED)
            self._probes = {name: part.index(torch.randint(len(part), (PROBE_SIZE,), generator=probe, device=self.device))
                            for name, part in (("train", self.data), ("holdout", self.holdout)) if part is not None}
        out: dict[str, float] = {}
        was_training = self.networks.training
        self.networks.train(False)
        try:
            for name, batch in self._probes.items():
                fitted = self.q_and_target(batch)
                if fitted is None:
                    return {}
                q, target = fitted
                if name == "train":
                    out["q_data"] = q.mean()
                out[f"td_{name}"] = (q - target).square().mean() / target.var().clamp_min(1e-8)
        finally:
            self.networks.train(was_training)
        return as_float(out)

    def normalize(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The normalised state observation [N, obs_dim] (mean / std of the dataset)."""
        return self.networks["obs_norm"](obs["state"].float())

    def sample(self, batch_size: int | None = None) -> Transitions:
        assert self.data is not None, "this algorithm was built without data (to act only)"
        return self.data.sample(batch_size or self.cfg.batch_size, self.generator)

    def state_dict(self) -> dict[str, Any]:
        """Optimizers and counters (the networks are the policy weights the runner checkpoints)."""
        return {"updates": self.updates, "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        for k, o in self.optimizers.items():
            o.load_state_dict(state["optimizers"][k])

    def train(self, mode: bool = True) -> None:
        self.networks.train(mode)

    @property
    def policy(self) -> OfflinePolicy:
        """An ``nn.Module`` over all networks with ``act`` (and ``sample_actions`` for chunked actors)."""
        if not hasattr(self, "_policy"):
            self._policy = (ChunkedOfflinePolicy if self.chunk_size > 1 else OfflinePolicy)(self)
        return self._policy


class OfflinePolicy(nn.Module):
    """The weights of an offline algorithm as one module (what checkpoints hold) and its ``act`` for evaluation."""

    def __init__(self, algo: OfflineAlgorithm):
        super().__init__()
        self.networks = algo.networks
        object.__setattr__(self, "algo", algo)  # not a submodule: the algorithm is no nn.Module

    @torch.no_grad()
    def act(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        self.algo.device = self.networks["obs_norm"].mean.device  # follows .to(device)
        return self.algo.act(obs, deterministic=deterministic)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.act({"state": state})


class ChunkedOfflinePolicy(OfflinePolicy):
    """Chunked actors: evaluation (``ChunkedActor``) plans ``sample_actions`` and runs ``execute_steps`` of each chunk."""

    def __init__(self, algo: OfflineAlgorithm, execute_steps: int = 0):
        super().__init__(algo)
        self.chunk_size = algo.chunk_size
        self.execute_steps = execute_steps or algo.chunk_size

    def sample_actions(self, obs: dict[str, torch.Tensor], deterministic: bool = True) -> torch.Tensor:
        return self.act(obs, deterministic=deterministic)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.act({"state": state})[:, 0]


@dataclass
class OfflinePolicyConfig(Section):
    execute_steps: NonNegativeInt = 0
    """chunked offline actors: actions of each planned chunk executed before re-planning (0 = the whole chunk)"""

    def observation_keys(self, run) -> tuple[str, ...]:
        return ("state",)  # the offline runner loads the dataset's state only

    def validate(self, run) -> None:
        if self.execute_steps < 0:
            raise ValueError(f"offline_policy.execute_steps must be >= 0 (0 = the whole chunk), got {self.execute_steps}")


def _build_offline_policy(meta: dict[str, Any], cfg: OfflinePolicyConfig) -> OfflinePolicy:
    """An offline algorithm's policy from a checkpoint's config.json (``train`` names the algorithm and its section)."""
    spec = algorithm_spec(saved_train(meta)["algo"])
    section = load_section(meta, spec.config_field, spec.config)
    algo = spec.learner(section, int(meta["obs_dim"]), int(meta["action_dim"]), None, "cpu", None)
    if algo.chunk_size > 1:
        algo._policy = ChunkedOfflinePolicy(algo, cfg.execute_steps)
    return algo.policy


register_policy(PolicySpec(OFFLINE_POLICY_KIND, "offline_policy", OfflinePolicyConfig, _build_offline_policy))


# ---------------------------------------------------------------------- shared pieces
def logs_workflow_metrics(learner: type | None) -> bool:
    """Whether an offline learner class gives ``q_and_target`` (and so logs the workflow metrics)."""
    return learner is not None and issubclass(learner, OfflineAlgorithm) and learner.q_and_target is not OfflineAlgorithm.q_and_target


def split_episodes(data: Transitions, holdout_fraction: float) -> tuple[Transitions, Transitions]:
    """(the transitions of the first episodes, those of the last ``holdout_fraction`` of them: at least one, never all)."""
    episodes = torch.unique(data.episode_index)
    held = min(len(episodes) - 1, max(1, round(holdout_fraction * len(episodes))))
    if held < 1:
        raise ValueError(f"holdout_fraction={holdout_fraction} needs a dataset of at least 2 episodes, it has {len(episodes)}")
    in_holdout = torch.isin(data.episode_index, episodes[len(episodes) - held:])
    train, holdout = (data.index(torch.nonzero(mask).squeeze(-1)) for mask in (~in_holdout, in_holdout))
    return replace(train, episode_end=None), replace(holdout, episode_end=None)  # ends recomputed in each part


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """IQL's expectile regression, mean of |tau - 1(u < 0)| u^2 with u = target - prediction (IQL: u = Q - V).

    With tau > 0.5 a prediction below its target (u > 0) costs more than one above it, so the prediction settles at
    an upper expectile of the targets (tau = 0.5: the mean, the squared error / 2)."""
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.square()).mean()


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, layer_norm: bool = False,
        activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    last = in_dim
    for h in hidden:
        layers.append(nn.Linear(last, h))
        if layer_norm:
            layers.append(nn.LayerNorm(h))
        layers.append(activation())
        last = h
    layers.append(nn.Linear(last, out_dim))
    return nn.Sequential(*layers)


def adam(params, lr: float, **kwargs: Any) -> torch.optim.Adam:
    """Adam with the fused kernel (one kernel for all parameters: 20 % faster steps on a CPU measured with a 64x64
    critic pair; also on CUDA), falling back to the default where this torch build has none."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, **kwargs)


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging: target <- (1 - tau) target + tau source."""
    for t, s in zip(target.parameters(), source.parameters(), strict=True):
        t.lerp_(s, tau)


def as_float(stats: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Losses to log, with one host sync per update (not one per loss term)."""
    tensors = {k: v.detach().float().reshape(()) for k, v in stats.items() if isinstance(v, torch.Tensor)}
    out = {k: float(v) for k, v in stats.items() if not isinstance(v, torch.Tensor)}
    if tensors:
        out.update(zip(tensors, torch.stack(list(tensors.values())).tolist(), strict=True))
    return {k: out[k] for k in stats}
