"""Multi-task SFT of the flow-matching chunk policy on so101-suite demonstrations (pass --dataset DIR).

The policy reads the instruction as token ids (per-position embeddings: a sentence embedding hardly separates "push
the blue cube to the red zone" from "push the red cube to the blue zone", cosine 0.993) and the state through
entity attention: the instruction's queries pick the named objects, container and zone by their names' words
(SO101Suite.entity_name_tokens; keys by learned identity stayed blurred over the cubes), so a few demos fit what the
words name instead of the distractors' positions, and the picked entities' positions relative to the gripper and
to each other (flow.entity_anchor) give the vectors a single-task state carries precomputed. The state
normaliser's std floor 0.02 keeps the objects' tilt noise (std ~1e-3 in the demos) from being scaled up to unit
variance. A smaller network than the single-task presets (256-wide velocity MLP): the suite runs were made on 2
shared CPU cores."""

from rlrobot.algorithms.sft import SFTConfig
from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig
from rlrobot.tasks.so101_suite import SO101Suite

SUITE_FLOW = FlowPolicyConfig(obs_keys=("state", "instruction_tokens"), state_entities=SO101Suite.state_entities,
                              entity_names=SO101Suite.entity_name_tokens, entity_anchor=SO101Suite.tcp_index,
                              state_std_min=0.02, state_hidden=(256, 128), embed_dim=128, velocity_hidden=(256, 256, 256))
CONFIG = train_config("sft", task="so101-suite", num_envs=1, sft=SFTConfig(num_updates=15000, batch_size=256),
                      flow=SUITE_FLOW, eval_every=0, eval_episodes=64, eval_envs=32, checkpoint_every=5)
