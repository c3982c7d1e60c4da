from rlrobot.config import train_config
from rlrobot.policies.flow import FlowPolicyConfig


def test_a_policy_that_reads_no_camera_of_an_env_that_renders_them_is_named_in_one_line():
    note = train_config("ppo", task="so101-reach", obs_mode="state+rgb").unread_cameras_note()
    assert note == ("obs_mode='state+rgb' renders camera images that the actor-critic policy does not read (it reads "
                    "['state']): --obs-mode state steps several times faster")


def test_no_note_without_cameras_or_when_the_policy_reads_one():
    assert train_config("ppo", task="so101-reach", obs_mode="state").unread_cameras_note() is None
    reads_camera = train_config("sft", task="so101-reach", obs_mode="state+rgb",
                                flow=FlowPolicyConfig(obs_keys=("state", "image_front")))
    assert reads_camera.unread_cameras_note() is None
    state_only = train_config("sft", task="so101-reach", obs_mode="state+rgb", flow=FlowPolicyConfig(obs_keys=("state",)))
    assert "the flow policy does not read" in state_only.unread_cameras_note()
