"""Flow-Noise PPO over the whole so101-suite (every env draws a family and an instruction per episode) from a
multi-task SFT checkpoint (pass --init PATH); the policy is the SFT preset's (instruction tokens, named entity
attention)."""

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-noise", task="so101-suite", num_envs=64, total_steps=640_000,
                      flow=SUITE_FLOW,
                      flow_ppo=FlowPPOConfig(rollout_chunks=10, critic_warmup_iterations=2), eval_every=25,
                      eval_episodes=128, eval_envs=32)
