"""``rlrobot collect`` over the suite stores each episode's own instruction as its LeRobotDataset task, and the
demonstration loader turns the frames' task strings back into the instruction observations the env produces."""

import numpy as np

from rlrobot.commands.collect import CollectArgs, collect_demonstrations
from rlrobot.data.demonstrations import load_demonstrations
from rlrobot.data.lerobot_dataset import read_lerobot_dataset
from rlrobot.tasks.so101_suite import SO101Suite


def test_collect_stores_per_episode_instructions_and_sft_reads_them(tmp_path):
    out = tmp_path / "demos"
    collect_demonstrations(CollectArgs(task="so101-push-to", episodes=4, out=str(out), num_envs=4, seed=0))
    data = read_lerobot_dataset(out)
    names = {i: t for t, i in data["tasks"].items()}
    tasks = [ep["tasks"] for ep in data["episodes"]]
    assert all(len(t) == 1 and t[0].startswith("push the ") for t in tasks)
    assert len({t[0] for t in tasks}) >= 3  # each env's own instruction, not env 0's for all
    episode = data["frames"]["episode_index"].reshape(-1)
    frame_tasks = [names[int(i)] for i in data["frames"]["task_index"].reshape(-1)]
    assert all(frame_tasks[k] == tasks[episode[k]][0] for k in range(len(frame_tasks)))
    assert not any(k.startswith("observation.instruction") for k in data["info"]["features"])

    env = SO101Suite(1)
    space = {k: tuple(v.shape) for k, v in env.single_observation_space.spaces.items()}
    env.close()
    demos = load_demonstrations(out, space, 5, 5, ("state", "instruction_embedding", "instruction_tokens"),
                                task="so101-push-to")
    expected = SO101Suite.instruction_observation(frame_tasks)
    np.testing.assert_array_equal(demos.obs["instruction_tokens"].numpy(), expected["instruction_tokens"])
    np.testing.assert_array_equal(demos.obs["instruction_embedding"].numpy(), expected["instruction_embedding"])
    assert demos.obs["state"].shape == (len(frame_tasks), space["state"][0])


def test_collect_one_instruction(tmp_path):
    """``--instruction``: every recorded episode carries that one task; a text outside the task's is refused first."""
    import pytest

    out = tmp_path / "one"
    text = "push the blue cube to the red zone"
    collect_demonstrations(CollectArgs(task="so101-push-to", episodes=3, out=str(out), num_envs=3, seed=0, instruction=text))
    data = read_lerobot_dataset(out)
    assert [ep["tasks"] for ep in data["episodes"]] == [[text]] * 3
    with pytest.raises(ValueError, match="is not one of the 12 instructions of so101-push-to"):
        collect_demonstrations(CollectArgs(task="so101-push-to", episodes=1, out=str(tmp_path / "x"),
                                           instruction="push the blue cube to the blue zone"))
    assert not (tmp_path / "x").exists()
