"""The VLAC-style process reward model on so101-suite datasets (pass --dataset DIR[,DIR...], e.g. the four families'
expert / noisy-high / mixed recipes): state and instruction tokens through the suite policy's named entity attention,
dense progress labels for successes too, the per-frame value head and a ranking loss with mismatched pairs as ties.
Sized for 2 shared CPU cores (5-17 minutes). Measured against its alternatives: docs/experiments/2026-12-07-prm-models.md."""

from rlrobot.algorithms.progress_model import PRMConfig
from rlrobot.config import train_config
from rlrobot.rewards.progress_model import PRMNetConfig
from rlrobot.tasks.so101_suite import SO101Suite

SUITE_PRM_NET = PRMNetConfig(obs_keys=("state", "instruction_tokens"), state_entities=SO101Suite.state_entities,
                             entity_names=SO101Suite.entity_name_tokens, entity_anchor=SO101Suite.tcp_index,
                             progress_head="value")
SUITE_PRM = PRMConfig(num_updates=5000, batch_size=256, success_labels="dense", filter_failures=False, rank_weight=0.5,
                      rank_mismatched_ties=True)
CONFIG = train_config("prm", task="so101-suite", num_envs=1, prm=SUITE_PRM,
                      prm_net=SUITE_PRM_NET, eval_every=0, checkpoint_every=5, video=True, update_threads=1)
