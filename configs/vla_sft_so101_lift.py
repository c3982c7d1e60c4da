"""SFT of a LeRobot VLA on so101-lift demonstrations (pass --vla.path DIR and --dataset DIR from `rlrobot collect
--task so101-lift --obs-mode state+rgb --control-mode joint_pos`): LeRobot's flow-matching loss, small lr."""

from rlrobot.algorithms.vla import VLASFTConfig
from rlrobot.config import train_config

CONFIG = train_config("vla-sft", task="so101-lift", num_envs=16, obs_mode="state+rgb", control_mode="joint_pos",
                      sft=VLASFTConfig(num_updates=3000, batch_size=32, lr=2.5e-5, warmup_updates=100),
                      eval_episodes=32)
