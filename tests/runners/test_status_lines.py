from types import SimpleNamespace

from rlrobot.runners.base import Runner


def test_a_shaped_training_line_names_both_returns_and_an_unshaped_one_says_return():
    shaped = Runner.status_line(None, {"perf/env_steps_per_s": 100.0, "train/return": -0.15, "train/task_return": 0.21,
                                       "train/success": 0.5})
    assert "shaped return -0.15  task return 0.21  success 0.50" in shaped
    plain = Runner.status_line(None, {"perf/env_steps_per_s": 100.0, "train/return": 3.0, "train/success": 0.5})
    assert "return 3.00  success 0.50" in plain and "shaped" not in plain and "task return" not in plain


def test_evaluation_lines_call_the_return_the_tasks_when_training_shapes_it():
    def label(shaping: str) -> str:
        return Runner.eval_return_label.fget(SimpleNamespace(cfg=SimpleNamespace(reward=SimpleNamespace(shaping=shaping))))

    assert label("dense-potential") == "task return"
    assert label("none") == "return"
