"""Multi-task SFT of the flow-matching chunk policy on so101-suite demonstrations (pass --dataset DIR): the policy
reads the state and the instruction embedding (concatenated; --flow.instruction-fusion film for FiLM). A smaller
network than the single-task presets (256-wide velocity MLP): the suite runs were made on 2 shared CPU cores."""

from rlrobot.algorithms.sft import SFTConfig
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig

SUITE_FLOW = FlowPolicyConfig(obs_keys=("state", "instruction_embedding"), state_hidden=(256, 128), embed_dim=128,
                              velocity_hidden=(256, 256, 256))
CONFIG = train_config("sft", task="so101-suite", num_envs=1, sft=SFTConfig(num_updates=1000, batch_size=128),
                      flow=SUITE_FLOW, eval_every=0, eval_episodes=64, eval_envs=32, checkpoint_every=5)
