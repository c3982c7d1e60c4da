"""ReCOIL on so101-push: imitation of expert demonstrations (--recoil.expert-dataset DIR, e.g. `rlrobot collect --task
so101-push --recipe expert --out DIR`; `rlrobot offline-bench` passes the task's expert recipe) from the arbitrary data
of --dataset (e.g. the noisy or mixed recipe), without rewards.

CPU preset, sized as IQL's (configs/iql_so101_push.py): 64x64 MLPs, 3,000 gradient steps, 10 expert episodes (offline
imitation's few demonstrations). gamma 0.9 (IQL's preset; the expert value g / (1 - gamma) is then 20 instead of the
reference's 200) and a Gumbel temperature of 1 for that value scale (the reference's README example: 5 at q_E 200).
The rest are the reference's: reward gap g 2, max_clip 7, beta 3. For a GPU: --recoil.hidden 256 256 --recoil.gamma 0.99
--recoil.value-temperature 5 --recoil.gradient-steps 1000000 --update-threads 0 --device cuda."""

from rlrobot.algorithms.recoil import ReCOILConfig
from rlrobot.config import train_config

CONFIG = train_config("recoil", task="so101-push", num_envs=1, update_threads=1, eval_episodes=32, eval_envs=16,
                      checkpoint_every=10,
                      recoil=ReCOILConfig(gradient_steps=3000, batch_size=256, updates_per_iteration=500, hidden=(64, 64),
                                          lr=3e-4, gamma=0.9, value_temperature=1.0, expert_episodes=10))
