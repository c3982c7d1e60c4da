"""The language-conditioned SO-101 suite: experts per family, instruction-dependent success, per-env instruction
resampling on autoreset, instruction tensors that match the strings, the long-horizon subtask index, and the
wrong-instruction check (the expert doing the drawn task, judged on a colour-swapped instruction, is at chance)."""

import numpy as np
import pytest
import torch

import rlrobot
from rlrobot.tasks.so101_suite import (
    COLOURS,
    EMBEDDINGS_TABLE,
    OBJECTS,
    VOCABULARY,
    SO101Suite,
    all_instructions,
    describe,
)


def run_expert(env, steps: int) -> list[dict]:
    infos = []
    for _ in range(steps):
        infos.append(env.step(env.expert_action())[4])
    return infos


@pytest.mark.slow
def test_expert_solves_every_family_and_is_at_chance_on_swapped_colours():
    """One suite episode in 48 envs: 32 judged on the drawn instruction (the expert solves every family; the
    128-episode table per family, all >= 0.97, is in the README), 16 judged on a colour-swapped instruction while the
    expert still does the drawn task: the words decide success, so those (almost) never succeed."""
    env = rlrobot.make("so101-suite", 48, seed=3)
    env.reset(seed=3)
    swapped = np.arange(32, 48)
    drawn = env.instruction
    env.relabel(swapped, *(np.array(x) for x in zip(*[env.colour_swapped_spec(i) for i in swapped], strict=True)))
    assert all(drawn[i] != env.instruction[i] and env.instruction[i] in all_instructions() for i in swapped)
    families = env.family.copy()
    info = run_expert(env, env.max_episode_steps)[-1]
    env.close()
    success = np.zeros(48, bool)
    success[info["episode"]["env_ids"].numpy()] = info["episode"]["success"].numpy()
    assert len(info["episode"]["env_ids"]) == 48
    assert success[:32].mean() >= 31 / 32
    assert set(families[:32].tolist()) == {0, 1, 2, 3}
    assert success[swapped].mean() <= 1 / 16


def test_success_depends_on_the_instruction():
    """The same final state (the expert's object in its container) succeeds for the drawn instruction and fails
    for the other container and for another object."""
    env = rlrobot.make("so101-pick-place", 4, seed=0, max_episode_steps=300)
    env.reset(seed=0)
    infos = run_expert(env, 110)
    assert infos[-1]["success"].all()
    ids = np.arange(4)
    kinds, objs, goals = env.subtask_kind.copy(), env.subtask_obj.copy(), env.subtask_goal.copy()
    state, drawn = env.get_state(), env.instruction
    env.relabel(ids, kinds, objs, 1 - goals, np.ones(4, np.int64))  # bin <-> bowl
    assert all(("bowl" in a) != ("bowl" in b) for a, b in zip(env.instruction, drawn, strict=True))
    info = env.step(env.expert_action())[4]
    assert not info["success"].any()
    env.set_state(state)
    other = np.array([[env.colour_swapped_spec(i)[1][0]] * 2 for i in ids])  # another object on the table
    assert (other[:, 0] != objs[:, 0]).all()
    env.relabel(ids, kinds, other, goals, np.ones(4, np.int64))
    assert not env.step(env.expert_action())[4]["success"].any()
    env.set_state(state)
    env.relabel(ids, kinds, objs, goals, np.ones(4, np.int64))  # the true instruction again
    assert env.step(env.expert_action())[4]["success"].all()
    env.close()


def test_autoreset_resamples_family_and_instruction_per_env():
    env = rlrobot.make("so101-suite", 16, seed=1, max_episode_steps=4)
    obs, _ = env.reset(seed=1)
    before = env.instruction
    assert len(set(env.family.tolist())) >= 3  # one batch mixes the families
    zeros = torch.zeros(16, 5)
    for _ in range(3):
        obs, _, _, _, info = env.step(zeros)
        assert "episode" not in info and env.instruction == before
    obs, _, _, truncated, info = env.step(zeros)
    assert truncated.all()
    assert info["episode"]["instruction"] == before  # the finished episodes' own instructions
    after = env.instruction
    assert sum(a != b for a, b in zip(before, after, strict=True)) >= 12  # each env drew its own new task
    np.testing.assert_array_equal(obs["instruction_tokens"].numpy(), VOCABULARY.encode(after))
    env.close()


def test_instruction_tensors_match_the_strings():
    env = rlrobot.make("so101-suite", 8, seed=2)
    obs, _ = env.reset(seed=2)
    table = np.load(EMBEDDINGS_TABLE)
    rows = {str(t): e for t, e in zip(table["texts"].tolist(), table["embeddings"], strict=True)}
    assert set(rows) == set(all_instructions())
    for i, text in enumerate(env.instruction):
        assert VOCABULARY.decode(obs["instruction_tokens"][i].numpy()) == text
        np.testing.assert_array_equal(obs["instruction_embedding"][i].numpy(), rows[text])
    assert obs["instruction_tokens"].dtype == torch.int64 and obs["instruction_embedding"].shape == (8, 384)
    assert env.single_observation_space["instruction_embedding"].shape == (384,)
    env.close()


def test_state_entities_point_at_each_entity_in_the_state():
    """flow.state_entities of the suite presets: object i's parts are its position, orientation and jaw contacts,
    then the containers' and the zones' positions, exactly where _state_obs writes them; the rest is the arm."""
    from rlrobot.policies.flow import parse_entities

    env = rlrobot.make("so101-suite", 4, seed=3)
    obs, _ = env.reset(seed=3)
    for _ in range(3):
        obs = env.step(env.expert_action())[0]
    state = obs["state"].numpy()
    objects, containers, zones = parse_entities(SO101Suite.state_entities)
    (pos, n, _), (quat, _, _), (contacts, _, _) = objects
    assert n == 6 and state.shape[1] == SO101Suite.state_dim
    np.testing.assert_allclose(state[:, pos:pos + 18].reshape(4, 6, 3), env.body_pos, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(state[:, quat:quat + 24].reshape(4, 6, 4), env.body_quat, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state[:, contacts:contacts + 12], env.contacts.astype(np.float32))
    start, count, width = containers[0]
    np.testing.assert_allclose(state[:, start:start + count * width].reshape(4, 2, 3), env.container_pos, atol=1e-6)
    start, count, width = zones[0]
    np.testing.assert_allclose(state[:, start:start + count * width].reshape(4, 4, 2), env.zone_pos[:, :, :2], atol=1e-6)
    tcp = SO101Suite.tcp_index  # flow.entity_anchor of the presets
    np.testing.assert_allclose(state[:, tcp:tcp + 3], env.tcp, atol=1e-6)
    # flow.entity_names: one name per entity, in state_entities order, in the instructions' own words
    names = [VOCABULARY.decode(np.array([int(i) for i in ids.split()])) for ids in SO101Suite.entity_name_tokens]
    assert names == [*(f"{c} {s}" for s, c in OBJECTS), "bin", "bowl", *(f"{c} zone" for c in COLOURS)]
    assert len(names) == sum(parts[0][1] for parts in (objects, containers, zones))
    env.close()


def test_long_horizon_index_advances_only_on_the_done_flag():
    env = rlrobot.make("so101-long-horizon", 8, seed=4, max_episode_steps=300)
    env.reset(seed=4)
    index = np.zeros(8, np.int64)
    seen_one = np.zeros(8, bool)
    for info in run_expert(env, 150):
        new = info["subtask_index"].numpy()
        done = info["subtask_done"].numpy()
        step = new - index
        assert set(np.unique(step)) <= {0, 1}
        assert done[step == 1, index[step == 1]].all()  # it moved on only where the current subtask holds
        seen_one |= new == 1
        index = new
    assert (index == 2).all() and seen_one.all()  # both subtasks, in order
    assert info["success"].all()


def test_swapped_instruction_option_shows_wrong_words_and_judges_the_drawn_task():
    env = SO101Suite(4, seed=6, swapped_instruction=True)
    obs, _ = env.reset(seed=6)
    shown = env.instruction
    for i, text in enumerate(shown):
        drawn = describe(env.subtask_kind[i], env.subtask_obj[i], env.subtask_goal[i], int(env.num_subtasks[i]))
        assert text != drawn and text in all_instructions()
        assert VOCABULARY.decode(obs["instruction_tokens"][i].numpy()) == text  # the policy reads the wrong words
    # the expert does the drawn task, against the words it is shown: every env succeeds (steps 50-64 of 150)
    succeeded = np.zeros(4, bool)
    for _ in range(100):
        succeeded |= env.step(env.expert_action())[4]["success"].numpy()
    assert succeeded.all() and env.instruction == shown
    env.close()


def test_one_instruction_option_draws_only_that_task_and_refuses_others():
    """``instruction=``: every env and every autoreset draws that one task (the layout still varies); a text that is
    not one of the task's instructions, or the option on a task outside the suite, is a one-line error before any env
    is built."""
    import pytest

    from rlrobot.config import train_config
    from rlrobot.tasks.so101_suite import SO101PickPlace

    text = "put the red cube in the bin"
    assert text in SO101PickPlace.instructions() and len(SO101PickPlace.instructions()) == 12
    env = rlrobot.make("so101-pick-place", 6, seed=3, instruction=text, max_episode_steps=2)
    obs, _ = env.reset(seed=3)
    first = obs["state"].clone()
    for _ in range(2):
        obs, _, _, truncated, info = env.step(torch.zeros(6, 5))
    assert truncated.all() and info["episode"]["instruction"] == [text] * 6
    assert env.instruction == [text] * 6 and not torch.equal(obs["state"], first)  # new layouts, same words
    env.close()
    suite = SO101Suite(8, seed=4, instruction="stack the green cube on the red cube")
    suite.reset(seed=4)
    assert set(suite.instruction) == {"stack the green cube on the red cube"} and set(suite.family.tolist()) == {2}
    suite.close()
    with pytest.raises(ValueError, match="instruction='put the red cube in the box' is not one of the 12 instructions"):
        train_config("ppo", task="so101-pick-place", instruction="put the red cube in the box").validate()
    with pytest.raises(ValueError, match="is not one of the 12"):  # a push-to text is not a pick-place task
        SO101PickPlace(2, instruction="push the red cube to the blue zone")
    with pytest.raises(ValueError, match=r"instruction applies to the tasks so101-long-horizon, so101-pick-place, so101-push-to, "
                                         r"so101-stack, so101-suite; not to task='so101-reach'"):
        train_config("ppo", task="so101-reach", instruction=text).validate()
    assert train_config("ppo", task="so101-pick-place", instruction=text).task_options()["instruction"] == text
    assert "instruction" not in train_config("ppo", task="so101-pick-place").task_options()
