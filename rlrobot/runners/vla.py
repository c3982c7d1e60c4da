"""Runners of the VLA algorithms: the flow-policy runners with the learner told which pi_RL variant to run (imported
only when a run starts)."""

from __future__ import annotations

from rlrobot.algorithms.flow_ppo import FlowPPO
from rlrobot.checkpoints import RUN_COPIES
from rlrobot.config import TrainConfig
from rlrobot.runners.flow_on_policy import FlowOnPolicyRunner
from rlrobot.runners.sft import SFTRunner


class KeepsBaseCopy:
    """A VLA run copies its base directory's files (all but the weights, which its checkpoints hold in full) into
    ``RUN/lerobot_base``; its checkpoints name that copy (``RUN_COPIES``), so eval / serve / deploy / --init load the
    run after the base directory moved or was deleted."""

    def keep_base_copy(self) -> None:
        from rlrobot.policies.vla.portable import RUN_COPY, copy_base

        if self.is_main:
            copy_base(self.cfg.vla.path, self.out / RUN_COPY, self.policy.tokenizer)
        self.meta[RUN_COPIES] = {"vla.path": RUN_COPY}


class VLAFlowRunner(KeepsBaseCopy, FlowOnPolicyRunner):
    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.keep_base_copy()

    def make_algorithm(self) -> FlowPPO:
        cfg = self.cfg
        return FlowPPO(self.policy, cfg.flow_ppo, cfg.spec.flow_variant, self.device, cfg.num_envs,
                       self.obs_specs(self.obs_keys), sync=self.data_parallel)


class VLASFTRunner(KeepsBaseCopy, SFTRunner):
    """Flow matching through the adapter (LeRobot's loss: || v - (eps - a) ||^2 on the task's action dims)."""

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        self.keep_base_copy()
