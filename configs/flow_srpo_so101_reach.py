"""Flow-SRPO on so101-reach from a few-demo SFT checkpoint (pass --init PATH): 64 envs in groups of 8 sharing a start
state, one whole 50-step episode per env per iteration (10 chunks of 5 actions: 3,200 env steps), SRPO rewards on the
standardised-state trajectory embeddings, GRPO advantages, Flow-Noise PPO's update. Use --reward-mode sparse (SRPO
reads only success; the step reward is not used)."""

from rlrobot.algorithms.flow_srpo import FlowSRPOConfig
from rlrobot.config import train_config

CONFIG = train_config("flow-srpo", task="so101-reach", num_envs=64, total_steps=128_000, reward_mode="sparse",
                      flow_srpo=FlowSRPOConfig(rollout_chunks=10, group_size=8), eval_every=4, eval_episodes=64)
