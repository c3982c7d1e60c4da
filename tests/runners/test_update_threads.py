from types import SimpleNamespace

import torch

from rlrobot.runners.base import SMALL_NETWORK_PARAMETERS, Runner
from rlrobot.tasks.mujoco_vec_env import default_num_threads


def update_threads_of(policy: torch.nn.Module, flag: int) -> int:
    return Runner.update_thread_count.fget(SimpleNamespace(cfg=SimpleNamespace(update_threads=flag), policy=policy))


def test_the_default_updates_a_small_policy_on_one_thread_and_a_large_one_on_every_core():
    small = torch.nn.Sequential(torch.nn.Linear(33, 256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 6))
    large = torch.nn.Linear(1000, SMALL_NETWORK_PARAMETERS // 1000 + 1)
    assert sum(p.numel() for p in small.parameters()) < SMALL_NETWORK_PARAMETERS
    assert update_threads_of(small, 0) == 1
    assert update_threads_of(large, 0) == default_num_threads()


def test_an_explicit_update_thread_count_is_kept_whatever_the_policy_size():
    assert update_threads_of(torch.nn.Linear(4, 4), 3) == 3
    assert update_threads_of(torch.nn.Linear(1000, 2000), 1) == 1
