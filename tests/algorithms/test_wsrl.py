"""Warm starts (rlrobot.algorithms.wsrl, rlrobot.runners.warm_start) on real so101-reach envs and a real
LeRobotDataset written by the scripted expert: --init copies the offline networks exactly, the warm-up makes no gradient
step, WSRL's replay buffer holds online transitions only, RLPD batches are half offline, resume is exact, bad input is
refused before compute."""

import dataclasses

import pytest
import torch

from rlrobot.algorithms.registry import algorithm_spec
from rlrobot.algorithms.wsrl import sac_weights_from_offline
from rlrobot.checkpoints import load_checkpoint, load_trainer_state
from rlrobot.config import train_config
from rlrobot.runners.base import make_runner

COMMON = dict(task="so101-reach", logger="none", video=False, eval_episodes=2, eval_envs=2, num_threads=1,
              max_episode_steps=20, update_threads=1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from rlrobot.commands.collect import CollectArgs, collect_demonstrations

    out = tmp_path_factory.mktemp("wsrl") / "reach_noisy"
    collect_demonstrations(CollectArgs(task="so101-reach", episodes=4, out=str(out), num_envs=4, noise=0.3))
    return out


@pytest.fixture(scope="module")
def cal_ql_run(tmp_path_factory, dataset):
    """A tiny Cal-QL pretraining with a REDQ ensemble of LayerNorm critics (the WSRL recipe, sizes cut down)."""
    from rlrobot.algorithms.cal_ql import CalQLConfig

    out = tmp_path_factory.mktemp("wsrl") / "calql"
    cfg = train_config("cal-ql", **COMMON, num_envs=1, dataset=str(dataset), out=str(out), seed=3,
                       cal_ql=CalQLConfig(gradient_steps=6, updates_per_iteration=3, batch_size=32, hidden=(16, 16),
                                          num_actions=2, num_critics=4, num_target_critics=2, critic_layer_norm=True,
                                          actor_q="mean", gamma=0.9))
    make_runner(cfg).learn()
    return out


def wsrl_config(init, out, **sac):
    section = dict(learning_starts=32, batch_size=16, utd=0.5, rollout_steps=4, buffer_size=10_000)
    section.update(sac)
    cfg = train_config("wsrl", **COMMON, num_envs=4, init=str(init), out=str(out), total_steps=64, checkpoint_every=1,
                       eval_every=0)
    cfg.wsrl = dataclasses.replace(cfg.wsrl, **section)
    return cfg


def nearest(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance of each row of a to its nearest row of b (exact: no matmul shortcut, whose rounding is ~1e-3)."""
    return torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist").min(1).values


def dataset_rows(data) -> torch.Tensor:
    return torch.cat([data.obs["state"], data.actions], 1)


def test_init_copies_the_offline_networks_and_the_warmup_makes_no_gradient_step(cal_ql_run, tmp_path):
    runner = make_runner(wsrl_config(cal_ql_run, tmp_path / "w", learning_starts=48))
    weights, _, ckpt = load_checkpoint(cal_ql_run)
    expected = sac_weights_from_offline(weights, algorithm_spec("cal-ql"))
    state = runner.policy.state_dict()
    assert set(expected) == set(state)
    for k, v in expected.items():
        assert torch.equal(state[k], v), k  # actor, 4 critics, targets, normaliser: bit for bit
    assert runner.policy.cfg.num_critics == 4 and runner.policy.cfg.critic_layer_norm
    assert runner.cfg.wsrl.gamma == 0.9 and runner.cfg.wsrl.actor_q == "mean"  # adopted from the pretraining
    assert torch.equal(runner.algo.log_alpha.detach(), load_trainer_state(ckpt)["algorithm"]["log_alpha"])
    before = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    runner.obs, _ = runner.env.reset(seed=0)
    assert not runner.random_actions()  # the warm-up acts with the init policy
    for _ in range(2):  # 2 x 16 = 32 env steps of the 48-step warm-up
        runner.train_iteration()
        runner.env_steps += runner.steps_per_iteration
    assert len(runner.replay) == 32
    for k, v in runner.policy.state_dict().items():
        assert torch.equal(v, before[k]), k  # parameters, targets and normaliser untouched
    assert runner.algo.num_updates == 0
    assert all(not o.state for o in runner.algo.optimizers.values())  # no optimizer step taken
    runner.train_iteration()  # collects the warm-up's last 16 steps with the frozen policy, then SAC starts
    assert len(runner.replay) == 48 and runner.algo.num_updates == 8  # UTD 0.5 x 16 new transitions
    assert any(not torch.equal(v, before[k]) for k, v in runner.policy.state_dict().items())


def test_wsrl_replay_holds_online_transitions_only(cal_ql_run, dataset, tmp_path):
    from rlrobot.data.transitions import load_transitions

    runner = make_runner(wsrl_config(cal_ql_run, tmp_path / "w"))
    summary = runner.learn()
    replay = runner.replay
    assert len(replay) == summary["env_steps"] == 64  # every stored transition is an env step of this run
    assert runner.algo.num_updates > 0 and runner.offline is None
    data = load_transitions(dataset, obs_shapes={"state": (replay.obs["state"].shape[-1],)}, action_dim=5,
                            task="so101-reach", control_mode="ee_delta", gamma=0.9)
    rows = len(replay) // replay.num_envs
    stored = torch.cat([replay.obs["state"][:rows].reshape(64, -1), replay.actions[:rows].reshape(64, -1)], 1)
    assert (replay.obs["state"][rows:] == 0).all()  # nothing beyond the online rows
    offline = dataset_rows(data)
    assert nearest(stored, offline).min() > 1e-3  # no (state, action) of the dataset is in the buffer
    assert runner.meta["warm_start"]["switch_step"] == 32


def test_rlpd_batches_are_half_offline_and_the_buffer_stays_online(dataset, tmp_path):
    cfg = train_config("rlpd", **COMMON, num_envs=4, dataset=str(dataset), out=str(tmp_path / "r"), total_steps=64)
    cfg.rlpd = dataclasses.replace(cfg.rlpd, learning_starts=16, batch_size=16, utd=0.5, rollout_steps=4,
                                   buffer_size=10_000)
    runner = make_runner(cfg)
    runner.learn()
    assert len(runner.replay) == 64 and runner.algo.num_updates > 0
    batch = runner.sample_batch(16)
    assert batch["offline_count"] == 8
    offline = dataset_rows(runner.offline)
    rows = torch.cat([batch["obs"]["state"], batch["actions"]], 1)
    replay = runner.replay
    online = torch.cat([replay.obs["state"][:16].reshape(64, -1), replay.actions[:16].reshape(64, -1)], 1)
    assert (nearest(rows[:8], offline) == 0).all()  # the first half: dataset rows
    assert (nearest(rows[8:], online) == 0).all()  # the second: rows of the online buffer
    assert nearest(online, offline).min() > 0  # which holds no dataset row
    # the normaliser is the dataset's (fitted once, not moved by the online data)
    assert torch.allclose(runner.policy.normalizer.mean, runner.offline.obs["state"].mean(0), atol=1e-5)


def test_cal_ql_online_keeps_the_data_and_the_regulariser(cal_ql_run, dataset, tmp_path):
    cfg = train_config("cal-ql-online", **COMMON, num_envs=4, init=str(cal_ql_run), dataset=str(dataset),
                       out=str(tmp_path / "k"), total_steps=48)
    cfg.cal_ql_online = dataclasses.replace(cfg.cal_ql_online, learning_starts=16, batch_size=16, utd=0.5,
                                            rollout_steps=4, buffer_size=10_000)
    runner = make_runner(cfg)
    assert runner.cfg.cal_ql_online.cql_alpha == 5.0 and runner.cfg.cal_ql_online.cql_actions == 2  # from the init
    runner.obs, _ = runner.env.reset(seed=0)
    for _ in range(2):
        runner.train_iteration()
        runner.env_steps += runner.steps_per_iteration
    stats = runner.train_iteration()
    assert stats["loss/cql_loss"] != 0.0 and len(runner.replay) == 48
    # the data is kept: half of every batch is dataset rows (where the regulariser applies), the rest online rows
    batch = runner.sample_batch(16)
    rows = torch.cat([batch["obs"]["state"], batch["actions"]], 1)
    online = torch.cat([runner.replay.obs["state"][:12].reshape(48, -1), runner.replay.actions[:12].reshape(48, -1)], 1)
    assert batch["offline_count"] == 8
    assert (nearest(rows[:8], dataset_rows(runner.offline)) == 0).all() and (nearest(rows[8:], online) == 0).all()


def test_resume_is_exact(cal_ql_run, tmp_path):
    full = make_runner(wsrl_config(cal_ql_run, tmp_path / "full", save_replay=True))
    full.learn()
    cut = wsrl_config(cal_ql_run, tmp_path / "cut", save_replay=True)
    cut.total_steps = 48  # stops one iteration after the switch
    make_runner(cut).learn()
    cut.total_steps, cut.resume = 64, True
    resumed = make_runner(cut)
    resumed.learn()
    assert resumed.algo.num_updates == full.algo.num_updates
    a, b = full.policy.state_dict(), resumed.policy.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def warmed_up(cal_ql_run, out, **sac):
    """A WSRL runner 16 env steps into its 32-step warm-up: the next iteration ends it and makes 8 updates."""
    runner = make_runner(wsrl_config(cal_ql_run, out, **sac))
    runner.obs, _ = runner.env.reset(seed=0)
    runner.train_iteration()
    runner.env_steps += runner.steps_per_iteration
    assert runner.algo.num_updates == 0 and len(runner.replay) == 16
    return runner


def test_actor_delay_steps_the_critics_only(cal_ql_run, tmp_path):
    runner = warmed_up(cal_ql_run, tmp_path / "d", actor_delay=8)
    actor = {k: v.clone() for k, v in runner.policy.actor.state_dict().items()}
    critic = {k: v.clone() for k, v in runner.policy.critic.state_dict().items()}
    target = {k: v.clone() for k, v in runner.policy.critic_target.state_dict().items()}
    log_alpha = runner.algo.log_alpha.detach().clone()
    stats = runner.train_iteration()  # the warm-up ends, then the first 8 gradient steps: all inside the delay
    assert runner.algo.num_updates == 8 and "loss/actor_loss" not in stats
    assert all(torch.equal(v, actor[k]) for k, v in runner.policy.actor.state_dict().items())
    assert torch.equal(runner.algo.log_alpha.detach(), log_alpha)
    assert not runner.algo.actor_optimizer.state and not runner.algo.alpha_optimizer.state
    assert any(not torch.equal(v, critic[k]) for k, v in runner.policy.critic.state_dict().items())
    assert any(not torch.equal(v, target[k]) for k, v in runner.policy.critic_target.state_dict().items())
    stats = runner.train_iteration()  # past the delay: SAC's actor and temperature steps
    assert "loss/actor_loss" in stats and runner.algo.num_updates == 16
    assert any(not torch.equal(v, actor[k]) for k, v in runner.policy.actor.state_dict().items())
    assert not torch.equal(runner.algo.log_alpha.detach(), log_alpha)


def critic_after_one_update(runner, batch, alpha: float) -> dict[str, torch.Tensor]:
    state = {k: v.clone() for k, v in runner.policy.state_dict().items()}
    with torch.no_grad():
        runner.algo.log_alpha.fill_(float(torch.log(torch.tensor(alpha))))
    torch.manual_seed(5)  # the actor samples a' from the global stream, the target subset from the generator
    runner.algo.update(batch, torch.Generator().manual_seed(5))
    critic = {k: v.clone() for k, v in runner.policy.critic.state_dict().items()}
    runner.policy.load_state_dict(state)
    runner.algo.critic_optimizer.state.clear()
    return critic


@pytest.mark.parametrize("backup_entropy", [True, False, None])
def test_backup_entropy_off_leaves_the_temperature_out_of_the_td_target(cal_ql_run, tmp_path, backup_entropy):
    # None: WSRL's default, which is its reference's (the TD target of the Cal-QL pretraining, without the entropy term)
    runner = warmed_up(cal_ql_run, tmp_path / "b", **({} if backup_entropy is None else {"backup_entropy": backup_entropy}))
    batch = runner.sample_batch(8)
    low, high = (critic_after_one_update(runner, batch, alpha) for alpha in (0.01, 100.0))
    same = all(torch.equal(low[k], high[k]) for k in low)
    assert same == (not backup_entropy)  # without the entropy term the critic step does not depend on alpha


def test_bad_input_is_refused_before_compute(cal_ql_run, dataset, tmp_path):
    cfg = train_config("wsrl", **COMMON, out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"algo='wsrl' starts from an offline checkpoint: pass --init RUN_DIR"):
        cfg.prepare()
    cfg = train_config("rlpd", **COMMON, out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"algo='rlpd' mixes offline data into every batch: pass --dataset DIR"):
        cfg.prepare()
    cfg = train_config("rlpd", **{**COMMON, "task": "so101-push"}, dataset=str(dataset), out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"recorded on task='so101-reach'.*this run trains task='so101-push'"):
        cfg.prepare()
    cfg = train_config("wsrl", **{**COMMON, "task": "so101-push"}, init=str(cal_ql_run), out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"was trained on task='so101-reach'"):
        cfg.prepare()
    cfg = train_config("wsrl", **COMMON, reward_mode="sparse", init=str(cal_ql_run), out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"pretrained on the dataset's dense reward; this run has --reward-mode sparse"):
        cfg.prepare()
    cfg = train_config("rlpd", **COMMON, dataset=str(dataset), out=str(tmp_path / "x"))
    cfg.rlpd.offline_ratio = 1.0
    with pytest.raises(ValueError, match=r"rlpd.offline_ratio must be in \(0, 1\)"):
        cfg.prepare()
    cfg = wsrl_config(cal_ql_run, tmp_path / "x", actor_delay=-1)
    with pytest.raises(ValueError, match=r"wsrl.actor_delay must be >= 0"):
        cfg.prepare()


def test_init_of_an_algorithm_that_does_not_fit_sac_is_refused(dataset, tmp_path):
    from rlrobot.algorithms.bc import BCConfig  # noqa: F401  (registered)

    bc = train_config("bc", **COMMON, num_envs=1, dataset=str(dataset), out=str(tmp_path / "bc"))
    section = bc.algorithm
    bc.bc = dataclasses.replace(section, gradient_steps=2, updates_per_iteration=2, batch_size=8, hidden=(8,))
    make_runner(bc).learn()
    cfg = train_config("wsrl", **COMMON, init=str(tmp_path / "bc"), out=str(tmp_path / "x"))
    with pytest.raises(ValueError, match=r"init holds an 'bc' checkpoint; a warm start needs an actor and critics that "
                                         r"fit SAC: a run of ") as refusal:
        cfg.prepare()
    named = set(str(refusal.value).rsplit(": a run of ", 1)[1].split(", "))
    assert {"awac", "cal-ql", "cal-ql-online", "rlpd", "sac", "wsrl"} <= named and "bc" not in named
