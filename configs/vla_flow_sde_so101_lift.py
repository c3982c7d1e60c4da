"""Flow-SDE PPO (hybrid ODE-SDE, noise level 0.5, RLinf's pi0.5 setting) of a LeRobot VLA on so101-lift; otherwise as
the Flow-Noise preset (pass --vla.path DIR)."""

from rlrobot.configs.vla_flow_noise_so101_lift import vla_ppo_preset

CONFIG = vla_ppo_preset("vla-flow-sde")
