"""Flow-Noise PPO of a LeRobot VLA on so101-lift (pass --vla.path DIR: a pi0 / pi0.5 / SmolVLA pretrained directory
whose features are observation.state [33], observation.images.front / .wrist and a 6-d action). Joint-position control
(LeRobot's SO-101 action space) with both cameras; pi_RL's fine-tuning settings: a small fixed policy lr, a faster
critic warmed up first, one pass per rollout. Sized for a GPU (64 envs, add --device cuda); on CPU use LoRA
and a few envs."""

from rlrobot.algorithms.vla import VLAFlowPPOConfig
from rlrobot.config import TrainConfig, train_config


def vla_ppo_preset(algo: str) -> TrainConfig:
    return train_config(algo, task="so101-lift", num_envs=64, total_steps=640_000, obs_mode="state+rgb",
                        control_mode="joint_pos",
                        flow_ppo=VLAFlowPPOConfig(rollout_chunks=10, num_epochs=1, num_minibatches=4, lr=5e-6,
                                                  lr_schedule="fixed", value_lr=1e-4, critic_warmup_iterations=2),
                        eval_every=20, eval_episodes=64)


CONFIG = vla_ppo_preset("vla-flow-noise")
