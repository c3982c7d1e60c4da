"""Flow-SRPO over the whole so101-suite from a multi-task SFT checkpoint (pass --init PATH; the policy is the SFT
preset's: instruction tokens, named entity attention): 256 envs in 32 groups of 8 that share a start state and so an
instruction, one whole 150-step episode per env per iteration (30 chunks of 5 actions: 38,400 env steps), SRPO rewards
on the standardised-state trajectory embeddings, GRPO advantages per group, no critic; lr 3e-5 fixed and
denoising-step noise std 0.02-0.05 (the suite's Flow-Noise preset's), 1,152,000 env steps (30 iterations).

Measured (README, suite section) from a 400-demo SFT at 0.219 on 256 fresh episodes: 0.336 / 0.262 / 0.309 (seeds
0 / 1 / 2); Flow-Noise PPO with a critic from the same SFT and env steps: 0.234."""

import dataclasses

from rlrobot.algorithms.flow_srpo import FlowSRPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-srpo", task="so101-suite", num_envs=256, total_steps=1_152_000, reward_mode="sparse",
                      flow=dataclasses.replace(SUITE_FLOW, noise_std_min=0.02, noise_std_max=0.05),
                      flow_srpo=FlowSRPOConfig(rollout_chunks=30, group_size=8, lr=3e-5, lr_max=3e-5,
                                               lr_schedule="fixed"),
                      eval_every=5, eval_episodes=128, eval_envs=32)
