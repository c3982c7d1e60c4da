"""Flow-SRPO: SRPO (self-referential latent progress, ``rlrobot.rewards.srpo``) as the reward of flow-policy RL.

Each iteration rolls out one whole episode per env from grouped start states (``group_size`` consecutive envs share
the start state and so the instruction, as Flow-NFT's group mode), embeds every episode (the mean of its frames'
features: the standardised state, or a PRM's encoder with ``--flow-srpo.encoder prm:PATH``), rewards it with SRPO
(1 for a success; a failure 0.6 sigmoid(10 (0.5 - d_hat)) by its distance to the successes of its instruction in the
batch), keeps the groups with a success rate in [low, high], and gives every chunk of an episode the GRPO advantage
(r - mean_g) / std_g of its group (0 in the filtered groups). The update is Flow-Noise PPO's (chain log-probs of the
learned-noise denoising steps, clipped ratio) on those advantages: no critic (the value loss has weight 0), as SRPO
and GRPO. Start from an SFT checkpoint (``--init``); ``--algo flow-noise`` with the task reward is the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlrobot.algorithms.flow_ppo import FlowPPOConfig, InitCheckpoint, adopt_init_architecture
from rlrobot.algorithms.ppo import validate_ppo_common
from rlrobot.algorithms.registry import AlgorithmSpec, register_algorithm
from rlrobot.domains import NonNegative, Positive, PositiveInt, UnitInterval
from rlrobot.rewards.progress_reward import check_prm_path
from rlrobot.rewards.srpo import SRPOSettings
from rlrobot.tasks.registry import is_adapter_task


@dataclass
class FlowSRPOConfig(FlowPPOConfig):
    group_size: PositiveInt = 8
    """envs that share one start state (a GRPO group); num_envs must be a multiple"""
    fail_scale: NonNegative = 0.6
    """a failure's reward is fail_scale * sigmoid(temperature * (0.5 - d_hat)) (SRPO: 0.6)"""
    temperature: Positive = 10.0
    """SRPO: 10"""
    low: UnitInterval = 0.1
    """group filter: keep groups with success rate in [low, high] (SRPO: [0.1, 0.9])"""
    high: UnitInterval = 0.9
    """upper end of the group filter"""
    cluster: Literal["dbscan", "mean"] = "dbscan"
    """success centres per instruction: dbscan clusters | the mean"""
    eps_scale: Positive = 0.5
    """(dbscan) eps = eps_scale x median pairwise success distance"""
    encoder: str = ""
    """per-frame features of the trajectory embedding: '' = the standardised state | prm:PATH = that progress model's
    encoder"""
    lr: Positive = 1e-5
    """policy learning rate (measured on so101-reach from a 5-demo SFT checkpoint: 1e-4, flow-policy PPO's default,
    collapsed the policy in its first update (KL 28, eval success 0.66 -> 0) for flow-srpo and flow-noise alike;
    1e-5 improved it)"""
    lr_max: Positive = 1e-5
    """upper bound of the adaptive lr (the lr may only fall below lr)"""
    value_coef: NonNegative = 0.0
    """no critic: the advantages are SRPO's group-normalised episode rewards"""
    normalize_advantages: bool = False
    """the advantages are already normalised within their groups"""

    @property
    def settings(self) -> SRPOSettings:
        return SRPOSettings(self.fail_scale, self.temperature, self.low, self.high, self.cluster, self.eps_scale)

    @property
    def discount(self) -> float | None:
        return None  # scores whole episodes: step rewards (and reward wrappers) are not used

    def validate(self, run) -> None:
        validate_ppo_common(self, "flow_srpo")
        if self.overlap:
            raise ValueError("flow_srpo.overlap: Flow-SRPO's grouped rollouts restart every env each iteration and may "
                             "skip the update; they do not overlap with it (not offered)")
        self.settings.validate("flow_srpo")
        for name in ("rollout_chunks", "num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"flow_srpo.{name} must be >= 1, got {getattr(self, name)}")
        if self.dual_clip <= 1.0:
            raise ValueError(f"flow_srpo.dual_clip must be > 1, got {self.dual_clip}")
        if is_adapter_task(run.task):
            raise ValueError(f"algo='flow-srpo' copies start states between envs, which needs a native task "
                             f"(get_state / set_state); task={run.task!r} is not one")
        if self.group_size < 2 or run.num_envs % self.group_size:
            raise ValueError(f"flow_srpo.group_size={self.group_size} must be >= 2 and divide num_envs={run.num_envs}")
        if self.encoder and not self.encoder.startswith("prm:"):
            raise ValueError(f"flow_srpo.encoder={self.encoder!r} must be '' (the state) or prm:PATH")
        if not self.encoder and "state" not in run.obs_mode:
            raise ValueError(f"flow_srpo.encoder='' embeds the state; obs_mode={run.obs_mode!r} has none (use "
                             "state+rgb or --flow-srpo.encoder prm:PATH)")
        if self.encoder:
            check_prm_path(self.encoder[4:], "flow_srpo.encoder")
        episode = run.episode_steps()
        execute = run.flow.execute_steps or run.flow.chunk_size
        if episode and self.rollout_chunks * execute != episode:
            raise ValueError(f"algo='flow-srpo' scores whole episodes: flow_srpo.rollout_chunks x flow.execute_steps = "
                             f"{self.rollout_chunks} x {execute} must equal the episode length {episode} (set "
                             f"flow_srpo.rollout_chunks={episode // execute} if it divides)")
        if not run.init and not run.resume:
            raise ValueError("algo='flow-srpo' fine-tunes a flow policy: pass --init CHECKPOINT (e.g. an --algo sft run) "
                             "or --init none to start from random weights")
        if (run.num_envs * self.rollout_chunks) % self.num_minibatches:
            raise ValueError(f"num_envs x flow_srpo.rollout_chunks = {run.num_envs * self.rollout_chunks} must be "
                             f"divisible by flow_srpo.num_minibatches={self.num_minibatches}")

    def prepare(self, run) -> None:
        adopt_init_architecture(run)


register_algorithm(AlgorithmSpec(
    name="flow-srpo", summary="Flow-Noise PPO on SRPO's group advantages (latent progress to the batch's successes; "
    "fine-tunes --init)", config_field="flow_srpo", config=FlowSRPOConfig, policy_kind="flow",
    runner="rlrobot.runners.flow_srpo:FlowSRPORunner", run_fields=(InitCheckpoint,)))
