"""Cal-QL fine-tuned online with the offline data kept ("keep the data", the WSRL paper's baseline) on so101-lift:
pass --init RUN_DIR (an --algo cal-ql run) and --dataset DIR (its dataset). Each batch half offline / half online,
the conservative regulariser (weight and sampled actions from the init run) on the offline half, floored at its MC
returns. CPU preset sized like configs/wsrl_so101_lift.py: UTD 0.5, batches of 256, updates from 1,024 online env
steps (collected by the init policy)."""

from rlrobot.algorithms.wsrl import CalQLOnlineConfig
from rlrobot.config import train_config

CONFIG = train_config("cal-ql-online", task="so101-lift", num_envs=16, total_steps=22_528, update_threads=1,
                      cal_ql_online=CalQLOnlineConfig(utd=0.5, batch_size=256, learning_starts=1_024, rollout_steps=16,
                                                      buffer_size=200_000, offline_ratio=0.5),
                      checkpoint_every=8, eval_every=8, eval_episodes=64, eval_envs=32)
