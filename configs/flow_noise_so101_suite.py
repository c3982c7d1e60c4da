"""Flow-Noise PPO over the whole so101-suite (every env draws a family and an instruction per episode) from a
multi-task SFT checkpoint (pass --init PATH); the policy is the SFT preset's (instruction tokens, named entity
attention).

lr 1e-5 (fixed) and denoising-step noise std 0.02-0.05: at flow-policy PPO's defaults (lr 1e-4 adaptive, std
0.08-0.16) the suite policy fell from 0.320 to 0.047 within 320k env steps; with these it stays near its start
(0.250), the best measured. No setting tried improves on the SFT start yet (README, suite section)."""

import dataclasses

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-noise", task="so101-suite", num_envs=64, total_steps=320_000,
                      flow=dataclasses.replace(SUITE_FLOW, noise_std_min=0.02, noise_std_max=0.05),
                      flow_ppo=FlowPPOConfig(rollout_chunks=10, critic_warmup_iterations=2, lr=1e-5, lr_max=1e-5),
                      eval_every=25, eval_episodes=128, eval_envs=32)
