import torch

import rlrobot
from rlrobot.envs.wrappers import VideoRecorder


def test_video_recorder_keeps_env0_episodes(tmp_path):
    env = VideoRecorder(rlrobot.make("so101-reach", 2, seed=0, max_episode_steps=5), max_episodes=1)
    env.reset(seed=0)
    for _ in range(12):
        env.step(torch.zeros(2, 5))
    assert len(env.frames) == 1 + 5  # the first frame plus one per step of env 0's first episode
    path = env.save(tmp_path / "v.mp4")
    assert path.stat().st_size > 1000
    env.close()
