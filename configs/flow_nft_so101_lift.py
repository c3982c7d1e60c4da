"""Flow-NFT on so101-lift from an SFT checkpoint (pass --init PATH): the flow-policy PPO presets' rollout (64 envs,
10 chunks of 5 actions per env per rollout, 3,200 env steps per iteration) and budget, for side-by-side comparisons."""

from rlrobot.algorithms.flow_nft import FlowNFTConfig
from rlrobot.config import train_config

CONFIG = train_config("flow-nft", task="so101-lift", num_envs=64, total_steps=1_600_000,
                      flow_nft=FlowNFTConfig(rollout_chunks=10, critic_warmup_iterations=2), eval_every=50, eval_episodes=64)
