from types import SimpleNamespace

from rlrobot.runners.base import MAX_SCHEDULED_EVALUATIONS, Runner


def scheduled(total_steps: int, cheap: bool, episodes: int = 64, episode_steps: int = 100) -> int:
    cfg = SimpleNamespace(total_steps=total_steps, eval_episodes=episodes, episode_steps=lambda: episode_steps)
    return Runner.scheduled_evaluations(SimpleNamespace(cfg=cfg, cheap_env_steps=cheap))


def test_an_on_policy_run_long_enough_is_evaluated_ten_times():
    assert scheduled(500_000, cheap=True) == MAX_SCHEDULED_EVALUATIONS == 10  # 64 x 100 steps: 6,400 per evaluation


def test_a_short_on_policy_run_evaluates_less_so_that_evaluation_stays_under_a_fifth_of_training():
    assert scheduled(100_000, cheap=True) == 3  # 3 x 6,400 = 19,200 <= 20,000 = 100,000 / 5
    assert 3 * 64 * 100 <= 100_000 / 5 < 4 * 64 * 100
    assert scheduled(3_000, cheap=True) == 1  # the final evaluation only


def test_runners_whose_updates_dominate_keep_ten_evaluations_whatever_their_env_steps():
    assert scheduled(20_000, cheap=False) == 10  # SAC / WSRL: a few thousand env steps cost minutes of updates
