"""Observation images rendered in the simulator's worker threads (one renderer per thread) equal those rendered on
the calling thread, and closing the env closes every thread's renderer."""

import numpy as np
import torch

import rlrobot


def _images(num_threads: int) -> list[dict[str, np.ndarray]]:
    env = rlrobot.make("so101-reach", 4, seed=0, obs_mode="state+rgb", num_threads=num_threads)
    try:
        obs, _ = env.reset(seed=0)
        frames = [{k: v.numpy().copy() for k, v in obs.items() if k.startswith("image_")}]
        gen = torch.Generator().manual_seed(0)
        for _ in range(2):
            obs, *_ = env.step(torch.rand(4, env.action_dim, generator=gen) * 2 - 1)
            frames.append({k: v.numpy().copy() for k, v in obs.items() if k.startswith("image_")})
        if num_threads > 1:
            assert env._worker_renderers == num_threads  # every pool thread rendered with its own renderer
    finally:
        env.close()
    assert env._worker_renderers == 0
    return frames


def test_worker_thread_rendering_matches_calling_thread():
    one, two = _images(1), _images(2)
    assert set(one[0]) == {"image_front", "image_wrist"}
    for a, b in zip(one, two, strict=True):
        for k in a:
            assert a[k].shape == (4, 3, 64, 64) and a[k].std() > 0  # real pictures, not blank buffers
            np.testing.assert_array_equal(a[k], b[k])
