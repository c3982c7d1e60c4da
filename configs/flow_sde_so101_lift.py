"""Flow-SDE PPO (hybrid ODE-SDE by default) on so101-lift from an SFT checkpoint (pass --init PATH)."""

import dataclasses

from rlrobot.configs.flow_noise_so101_lift import CONFIG as NOISE

CONFIG = dataclasses.replace(NOISE, algo="flow-sde")
