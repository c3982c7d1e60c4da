"""Multi-task SFT of the flow-matching chunk policy on so101-suite demonstrations (pass --dataset DIR): instruction
token ids and the state through named entity attention (the words pick the objects, container and zone), a state
normaliser std floor of 0.02, a 256-wide velocity MLP for 2 CPU cores. Measured: docs/experiments/2026-12-05-language-suite.md."""

from rlrobot.algorithms.sft import SFTConfig
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.tasks.so101_suite import SO101Suite

SUITE_FLOW = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), state_entities=SO101Suite.state_entities,
                              entity_names=SO101Suite.entity_name_tokens, entity_anchor=SO101Suite.tcp_index,
                              state_std_min=0.02, state_hidden=(256, 128), embed_dim=128, velocity_hidden=(256, 256, 256))
CONFIG = train_config("sft", task="so101-suite", num_envs=1, sft=SFTConfig(num_updates=15000, batch_size=256),
                      flow=SUITE_FLOW, eval_every=0, eval_episodes=64, eval_envs=32, checkpoint_every=5)
