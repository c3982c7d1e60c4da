"""Flow-Noise PPO over the whole so101-suite (every env draws a family and an instruction per episode) from a
multi-task SFT checkpoint (pass --init PATH); the policy is the SFT preset's (instruction tokens, named entity
attention).

The best measured setting (README, suite section), from the 0.320 SFT policy: 256 envs (12,800 env steps per
iteration: the suite's 108 instructions made 64-env batches too noisy), success-only reward (the suite's dense reward
collapsed so101-push-to alone), lr 3e-5 fixed and denoising-step noise std 0.02-0.05 (at flow-policy PPO's defaults,
lr 1e-4 adaptive and std 0.08-0.16, the policy fell to 0.047). It ends at 0.359, within the evaluation's noise of its
start; from a weaker SFT (0.219 on 256 fresh episodes) it ended at 0.234 after 1.15M env steps, its evaluations swinging
0.25-0.40. Flow-SRPO (configs/flow_srpo_so101_suite.py, no critic) took the same SFT to 0.336 / 0.262 / 0.309 (3 seeds)."""

import dataclasses

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-noise", task="so101-suite", num_envs=256, total_steps=768_000, reward_mode="sparse",
                      flow=dataclasses.replace(SUITE_FLOW, noise_std_min=0.02, noise_std_max=0.05),
                      flow_ppo=FlowPPOConfig(rollout_chunks=10, critic_warmup_iterations=2, lr=3e-5, lr_max=3e-5),
                      eval_every=10, eval_episodes=128, eval_envs=32)
