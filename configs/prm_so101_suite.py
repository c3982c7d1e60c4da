"""The VLAC-style process reward model on so101-suite datasets (pass --dataset DIR[,DIR...], e.g. a folder of the four
families' expert / noisy-high / mixed recipes written by `rlrobot collect --recipe`): state observations and the
instruction's token ids, read through the suite policy's named entity attention with relations (the instruction's
words pick the named cube, container and zone; their positions relative to the gripper and to each other are what
"done" and progress are made of). Sized for 2 shared CPU cores (5-17 minutes).

Successful episodes are labelled by the task's dense progress like the failures (``--prm.success-labels dense``: one
state function for both, instead of VLAC's time progress for successes), and the time-correlation filter applies to
successes only (``--prm.no-filter-failures``). Measured (README, process reward models) on 144 held-out episodes,
three runs (pair head, the data of 2026-12-06) against the time-labelled, fully filtered preset before it:
Spearman 0.871-0.886 (anchored curve 0.889-0.909) against 0.852 (0.883), done F1 0.985-0.989, mismatch ratio
0.08-0.15. The price is transfer to a family held out of training (long-horizon: Spearman 0.117 against 0.653 with
time labels): for that test pass ``--prm.success-labels time --prm.filter-failures``.

The progress head is the per-frame one (``--prm-net.progress-head value``: delta = (V_a - V_b) / (1 - V_b) of one
learnt V(s)), so an episode's chain of pairs does not accumulate pair errors. Measured on the same data and 144
held-out episodes, three seeds each, against VLAC's pair head (``--prm-net.progress-head pair``, the preset before
2026-12-07): Spearman 0.890-0.902 against 0.841-0.857 (data/val: 0.876-0.887 against 0.807-0.834); on another
machine's regeneration of the data (the README's data A) 0.891-0.897 against 0.871-0.886 (data/val 0.872-0.876 against
0.845).

A pairwise ranking loss on top of the squared error (``--prm.rank-weight 0.5``: RankNet's logistic loss on the order
of each forward / reversed pair's two frames, the mismatched pairs as ties, ``--prm.rank-mismatched-ties``), since
2026-12-07: on data A, three seeds, Spearman 0.928-0.931 against 0.891-0.897 (data/val 0.899-0.907 against
0.872-0.885), all of it on the failed episodes, mismatch ratio 0.03-0.09. Without the ties the ranking loss made
the model more sensitive to small state changes under any instruction (mismatch ratio 0.16-0.22). Transfer to a
family held out of training (long-horizon) depends on the seed with or without it: 0.135 / 0.664 / 0.613 (seeds
0-2) against 0.635 / 0.205 with ``--prm.rank-weight 0`` (seeds 0-1), data A."""

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
