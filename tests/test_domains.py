"""Every numeric field of every run config declares its allowed values, and a value outside them is refused in one
line naming the field, before any compute (rlrobot.domains)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlrobot.algorithms.registry import describe_algorithms
from rlrobot.config import config_class, train_config
from rlrobot.domains import check_domains, domain_of, numeric_fields

ALGOS = [row["algo"] for row in describe_algorithms()]


def _set(cfg, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, last, value)


def _outside(annotation) -> list:
    """Values just outside a field's domain, NaN and infinities for floats."""
    domain, elementwise = domain_of(annotation)
    is_float = "float" in str(annotation)
    bad: list = [math.nan, math.inf, -math.inf] if is_float else []
    if domain.low is not None:
        bad.append(domain.low if domain.low_open else domain.low - 1)
    if domain.high is not None:
        bad.append(domain.high if domain.high_open else domain.high + 1)
    return [(v,) for v in bad] if elementwise else bad


@pytest.mark.parametrize("algo", ALGOS)
def test_every_numeric_field_declares_its_domain(algo):
    undeclared = [name for name, annotation in numeric_fields(config_class(algo)) if domain_of(annotation)[0] is None]
    assert not undeclared, f"{algo}: numeric fields without a domain (rlrobot.domains): {undeclared}"


@pytest.mark.parametrize("algo", ALGOS)
def test_values_outside_a_fields_domain_are_refused_naming_the_field(algo):
    checked = 0
    for name, annotation in numeric_fields(config_class(algo)):
        for value in _outside(annotation):
            cfg = train_config(algo)
            check_domains(cfg)  # the defaults are inside every domain
            _set(cfg, name, value)
            with pytest.raises(ValueError, match=rf"^{name} must be "):
                check_domains(cfg)
            checked += 1
    assert checked >= 20


def test_a_negative_noise_std_fails_in_one_line_before_the_run_directory_exists(tmp_path):
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "rlrobot", "train", "--task", "so101-reach", "--policy.init-noise-std", "-1",
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == "" and p.stdout.strip().splitlines() == [
        "error: policy.init_noise_std must be > 0, got -1.0"]
    assert not Path(out).exists()


def test_nan_in_a_reward_scale_is_refused_before_compute():
    cfg = train_config("ppo", task="so101-reach")
    cfg.reward.prm.scale = math.nan
    with pytest.raises(ValueError, match=r"^reward.prm.scale must be > 0, got nan"):
        cfg.validate()
