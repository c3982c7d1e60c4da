"""Flow-Noise PPO on so101-pick-place alone from an SFT checkpoint (pass --init PATH; the policy is the suite SFT
preset's): success-only reward, 64 envs x 10 chunks (3,200 env steps per iteration), RSL-RL's adaptive lr starting at
1e-5, denoising-step noise std 0.08-0.16, 1,024,000 env steps.

Measured (README, suite section) from a 100-demo SFT at 0.555: 0.812 / 0.859 at 896k env steps (seeds 0 / 1), 0.750 /
0.734 at the end. Starting the adaptive lr at 1e-4 (flow-policy PPO's default) took the same policy to 0.000 within
128k env steps; the suite's own preset (256 envs, lr 3e-5 fixed, noise std 0.02-0.05) left a 50-demo SFT at 0.20
after 1M env steps (evaluations 0.09-0.30)."""

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.config import train_config
from rlrobot.configs.sft_so101_suite import SUITE_FLOW

CONFIG = train_config("flow-noise", task="so101-pick-place", num_envs=64, total_steps=1_024_000, reward_mode="sparse",
                      flow=SUITE_FLOW, flow_ppo=FlowPPOConfig(rollout_chunks=10, critic_warmup_iterations=2, lr=1e-5),
                      eval_every=20, eval_episodes=64)
