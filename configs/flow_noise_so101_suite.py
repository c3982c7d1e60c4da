"""Flow-Noise PPO over the whole so101-suite from a multi-task SFT checkpoint (pass --init PATH): 256 envs, success-only
reward, lr 3e-5 fixed and denoising noise std 0.02-0.05 (flow-policy PPO's defaults collapsed the policy). Measured:
docs/experiments/2026-12-05-language-suite.md."""

import dataclasses

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-noise", task="so101-suite", num_envs=256, total_steps=768_000, reward_mode="sparse",
                      flow=dataclasses.replace(SUITE_FLOW, noise_std_min=0.02, noise_std_max=0.05),
                      flow_ppo=FlowPPOConfig(rollout_chunks=10, critic_warmup_iterations=2, lr=3e-5, lr_max=3e-5),
                      eval_every=10, eval_episodes=128, eval_envs=32)
