"""Flow-NFT on so101-push from an SFT checkpoint (pass --init PATH)."""

import dataclasses

from rlrobot.configs.flow_nft_so101_lift import CONFIG as LIFT

CONFIG = dataclasses.replace(LIFT, task="so101-push")
