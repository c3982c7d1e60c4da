"""Contact-study task options: the published tasks are unchanged by default; the options change exactly the
contact time constants / the floor; the study variants train with the so101-lift presets' settings."""

import mujoco
import numpy as np
import pytest

from rlrobot.results.registry import ENTRIES, FLOW_NOISE_LIFT_FLAGS, SFT_LIFT_FLAGS
from rlrobot.tasks.so101 import JAW_TIP_FLOOR, SO101Lift, SO101Push


def _solref(env, geom: str) -> float:
    return float(env.models[0].geom(geom).solref[0])


def test_defaults_are_the_published_physics():
    env = SO101Lift(2, seed=0)
    xml = mujoco.MjModel.from_xml_path(env.xml_path)
    try:
        for m in env.models:
            np.testing.assert_array_equal(m.geom_solref, xml.geom_solref)
            np.testing.assert_array_equal(m.geom_solmix, xml.geom_solmix)
        assert env.jaw_tip_floor == JAW_TIP_FLOOR == 0.004 and _solref(env, "cube") == 0.03
    finally:
        env.close()


def test_contact_options_change_the_contacts_only():
    old = SO101Lift(2, seed=0, contact_solref=0.005, jaw_tip_floor=None)
    jaws = SO101Push(2, seed=0, jaw_solref=0.005)
    try:
        assert all(m.geom("cube").solref[0] == 0.005 and m.geom("table").solref[0] == 0.005 for m in old.models)
        assert old.jaw_tip_floor is None
        assert _solref(jaws, "fixed_jaw") == _solref(jaws, "moving_jaw") == 0.005 and _solref(jaws, "cube") == 0.03
        assert jaws.models[0].geom("fixed_jaw").solmix[0] > 1e3 * jaws.models[0].geom("cube").solmix[0]
    finally:
        old.close()
        jaws.close()


@pytest.mark.parametrize("options, field", [({"contact_solref": 0.0}, "contact_solref"), ({"jaw_solref": -1}, "jaw_solref"),
                                            ({"jaw_tip_floor": -0.01}, "jaw_tip_floor")])
def test_bad_options_are_refused(options, field):
    with pytest.raises(ValueError, match=field):
        SO101Lift(1, **options)


def test_no_floor_lets_down_moves_reach_the_table():
    """Holding 'down' with an open jaw: the floor stops the jaw tips 4 mm up; without it they go lower."""
    lowest = {}
    for floor in (JAW_TIP_FLOOR, None):
        env = SO101Lift(4, seed=0, jaw_tip_floor=floor)
        env.reset(seed=0)
        import torch

        down = torch.tensor([[0.0, 0.0, -1.0, 0.0, 1.0]]).repeat(4, 1)
        for _ in range(30):
            env.step(down)
        lowest[floor] = float(env.jaw_tips[:, :, 2].min())
        env.close()
    assert lowest[JAW_TIP_FLOOR] >= JAW_TIP_FLOOR - 0.002
    assert lowest[None] < lowest[JAW_TIP_FLOOR] - 0.001


def test_study_flags_rebuild_the_lift_presets():
    """The contact-study variants get the so101-lift presets as flags (presets are looked up by task name)."""
    from rlrobot.commands.train import parse_train_args
    from rlrobot.configs import preset

    for algo, flags in (("sft", SFT_LIFT_FLAGS), ("flow-noise", FLOW_NOISE_LIFT_FLAGS)):
        from_flags = parse_train_args(["--algo", algo, "--task", "so101-reach", *flags])
        from_flags.task = "so101-lift"
        assert from_flags.to_dict() == preset("so101-lift", algo).to_dict(), algo
    study = [e for e in ENTRIES if e.name.startswith("study-lift-")]
    assert len(study) == 4 and all(len(e.steps) == 3 for e in study)
