"""Runners of the VLA algorithms: the flow-policy runners with the learner told which pi_RL variant to run (imported
only when a run starts)."""

from __future__ import annotations

from rlrobot.algorithms.flow_ppo import FlowPPO
from rlrobot.runners.flow_on_policy import FlowOnPolicyRunner
from rlrobot.runners.sft import SFTRunner


class VLAFlowRunner(FlowOnPolicyRunner):
    def make_algorithm(self) -> FlowPPO:
        cfg = self.cfg
        return FlowPPO(self.policy, cfg.flow_ppo, cfg.spec.flow_variant, self.device, cfg.num_envs,
                       self.obs_specs(self.obs_keys), sync=self.data_parallel)


class VLASFTRunner(SFTRunner):
    """Flow matching through the adapter (LeRobot's loss: || v - (eps - a) ||^2 on the task's action dims)."""
