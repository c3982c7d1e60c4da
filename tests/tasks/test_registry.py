import pytest

import rlrobot


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ValueError, match="so101-reach"):
        rlrobot.make("so101-fly", 2)


def test_unknown_prefix_and_gym_id():
    with pytest.raises(ValueError, match="valid prefixes"):
        rlrobot.make("foo:Bar-v0", 2)
    with pytest.raises(ValueError, match="gymnasium has no env id"):
        rlrobot.make("gym:NoSuchEnv-v9", 2)


@pytest.mark.parametrize("opts, field", [({"obs_mode": "depth"}, "obs_mode"), ({"control_mode": "torque"}, "control_mode"),
                                         ({"reward_mode": "shaped"}, "reward_mode"), ({"backend": "bullet"}, "backend")])
def test_bad_options_name_the_field(opts, field):
    with pytest.raises(ValueError, match=field):
        rlrobot.make("so101-reach", 2, **opts)


def test_num_envs_must_be_positive():
    with pytest.raises(ValueError, match="num_envs"):
        rlrobot.make("so101-reach", 0)


def test_backend_must_match_task():
    with pytest.raises(ValueError, match="runs on backend"):
        rlrobot.make("so101-reach", 1, backend="gymnasium")
