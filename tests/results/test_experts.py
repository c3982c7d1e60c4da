from rlrobot.results.experts import expert_rates


def test_expert_rates_on_the_language_suite_split_by_family_over_the_same_fixed_episodes():
    rates = expert_rates("so101-suite", episodes=24, seed=0, num_envs=8)
    families = rates["families"]
    assert set(families) <= {"pick-place", "push-to", "stack", "long-horizon"} and len(families) >= 3
    assert sum(f["episodes"] for f in families.values()) == rates["episodes"] == 24
    weighted = sum(f["success"] * f["episodes"] for f in families.values()) / 24
    assert abs(weighted - rates["success"]) < 1e-9


def test_a_single_task_has_no_family_split():
    assert "families" not in expert_rates("so101-reach", episodes=4, seed=0, num_envs=4)
