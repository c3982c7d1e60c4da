"""``rlrobot bench --peers``: rlrobot against Stable-Baselines3, rsl_rl and EnvPool on the same task, network and
batch, interleaved in one process (round-robin over ``rounds``), ratios from the medians.

What each row times (env steps per second unless said otherwise):

- **PPO training** (``ppo_*``): a real training run of ``iterations`` x (num_envs x rollout_steps) env steps from a
  fresh learner, construction excluded, nothing discarded as warm-up.
  - rlrobot: ``OnPolicyRunner.learn()`` (what ``rlrobot train`` runs) on the native batched task
    ``mujoco-<id>`` and, for reference, on gymnasium's own env through the adapter (``gym:<id>``); the rate is the
    run's env steps over its training wall time (the sum of its iterations: rollout, update, normaliser, logging;
    the final evaluation and checkpoint writes are outside it, exactly the figure ``rlrobot train`` prints).
  - SB3: ``PPO("MlpPolicy", make_vec_env(id, n_envs))`` (a ``DummyVecEnv`` of gymnasium envs, what SB3's users run),
    wall time of ``model.learn(total_timesteps)``.
  - rsl_rl: ``OnPolicyRunner.learn(iterations)`` on gymnasium's ``SyncVectorEnv`` (same-step autoreset) behind the
    few lines of rsl_rl ``VecEnv`` glue below (rsl_rl ships no gymnasium wrapper), wall time of ``learn``.
  Same settings for all three: the MLPs (``hidden``, tanh, separate actor and critic, state-independent std, init
  std 1), rollout length, epochs, minibatch size, lr (fixed), clip 0.2, gamma 0.99, lambda 0.95, value coef 0.5, grad
  norm 0.5, entropy 0, no observation or reward normalisation, ``update_threads`` torch threads for the update
  (default 1). ``ppo_rlrobot_native_fast`` is the same rlrobot run with the two opt-ins that are not bit-identical
  to the default: ``policy.activation tanh-fast`` (tanh computed as 2 sigmoid(2x) - 1, within 2e-7; torch's CPU tanh
  kernel is ~15x slower than its sigmoid) and ``ppo.fused_adam``; ``ppo_rlrobot_native_compiled`` adds
  ``ppo.compile`` (torch.compile of the minibatch loss) and counts the iterations after its first, which compiles
  (printed as "first iteration ... s"). What differs: value-loss clipping
  (rlrobot and rsl_rl clip at 0.2, SB3's default does not), advantage normalisation (per rollout in rlrobot and
  rsl_rl, per minibatch in SB3), the KL statistics rlrobot and rsl_rl compute per minibatch, SB3's action clipping
  outside the policy vs our clamp.
- **Raw stepping** (``raw_*``): ``num_envs`` envs stepped with fixed random actions, no learner: rlrobot's
  ``raw_step`` (physics only) and ``env.step`` (the VecEnv: physics, gather, reward, obs tensors, autoreset), EnvPool
  (``envpool.make_gymnasium(id, num_envs, num_threads)``, its C++ thread pool), and gymnasium's ``SyncVectorEnv``.
- **SAC gradient updates/s** (``sac_*``): the same 256x256 ReLU actor and twin critics, batch 256, on a replay buffer
  filled with 1,000 random transitions of the task: rlrobot's ``SAC.update`` (with its replay sampling, as the
  runner calls it) and SB3's ``SAC.train(gradient_steps, batch_size)``, each timed for ``sac_updates`` updates.

The machine is whatever runs it: on a shared machine the rounds interleave so that load affects every library alike;
report ratios, not absolute figures, from such runs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

import rlrobot
from rlrobot.algorithms.ppo import PPOConfig
from rlrobot.bench.common import console
from rlrobot.config import train_config
from rlrobot.configs import preset
from rlrobot.policies.actor_critic import ActorCriticConfig
from rlrobot.runners.off_policy import OffPolicyRunner
from rlrobot.runners.on_policy import OnPolicyRunner
from rlrobot.tasks.mujoco_vec_env import default_num_threads
from rlrobot.tasks.registry import is_adapter_task

BENCH_EXTRA = "pip install 'rlrobot[bench]' (stable-baselines3, rsl-rl-lib, envpool)"


@dataclass
class PeerSettings:
    """The one configuration every library runs (defaults: the HalfCheetah comparison of the benchmarks page)."""

    gym_id: str = "HalfCheetah-v5"
    """gymnasium id; rlrobot runs mujoco-<id> (native) and gym:<id> (adapter), SB3 / rsl_rl / EnvPool run <id>"""
    num_envs: int = 16
    """envs of the PPO training runs"""
    rollout_steps: int = 128
    """steps per env per PPO iteration (16 x 128 = 2,048 per iteration)"""
    num_epochs: int = 5
    """PPO epochs per iteration"""
    minibatch_size: int = 256
    """PPO minibatch size"""
    hidden: tuple[int, ...] = (256, 256)
    """hidden widths of actor and critic (tanh)"""
    lr: float = 3e-4
    """fixed learning rate"""
    iterations: int = 4
    """PPO iterations per timed training run"""
    raw_num_envs: tuple[int, ...] = (16, 256)
    """env counts of the raw-stepping rows"""
    raw_seconds: float = 2.0
    """time of each raw-stepping sample"""
    sac_updates: int = 200
    """SAC gradient updates per timed sample"""
    rounds: int = 3
    """interleaved rounds (the median is reported)"""
    num_threads: int = 0
    """simulator threads for rlrobot and EnvPool (0 = all cores)"""
    update_threads: int = 1
    """torch threads of every library's PPO / SAC update (SB3 and rsl_rl have one setting for the whole run: they get
    it for the whole run; rlrobot's rollout inference stays on 1 thread while its simulator pool steps)"""
    fast_row: bool = True
    """also time ppo_rlrobot_native_fast: the same run with policy.activation tanh-fast (tanh as 2 sigmoid(2x) - 1,
    within 2e-7 of torch.tanh) and ppo.fused_adam (the opt-ins that are not bit-identical to the default)"""
    compile_row: bool = True
    """also time ppo_rlrobot_native_compiled: the fast row plus ppo.compile (torch.compile of the minibatch loss); its
    rate counts the iterations after the first, which pays the compile (reported as its own figure)"""

    def __post_init__(self):
        if self.compile_row and self.iterations < 2:
            raise ValueError(f"peer.iterations={self.iterations}: the compiled row times the iterations after its "
                             "first, so it needs >= 2 (or --peer.no-compile-row)")

    @property
    def num_minibatches(self) -> int:
        return self.num_envs * self.rollout_steps // self.minibatch_size


def _available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def missing_peers() -> list[str]:
    return [name for name, mod in (("stable-baselines3", "stable_baselines3"), ("rsl-rl-lib", "rsl_rl"),
                                   ("envpool", "envpool")) if not _available(mod)]


def _threads(s: PeerSettings) -> int:
    return s.num_threads or default_num_threads()


# ---------------------------------------------------------------- PPO training
def ppo_rlrobot(s: PeerSettings, task: str, fast: bool = False, compiled: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="rlrobot-peers-") as out:
        cfg = train_config(
            "ppo", task=task, num_envs=s.num_envs, total_steps=s.iterations * s.num_envs * s.rollout_steps,
            control_mode="joint_torque" if not is_adapter_task(task) else "ee_delta", logger="none", out=out, video=False,
            eval_every=0, eval_envs=1, eval_episodes=1, checkpoint_every=10**6, torch_threads=1,
            update_threads=s.update_threads, num_threads=s.num_threads,
            ppo=PPOConfig(rollout_steps=s.rollout_steps, num_epochs=s.num_epochs, num_minibatches=s.num_minibatches,
                          lr=s.lr, lr_schedule="fixed", entropy_coef=0.0, value_coef=0.5, max_grad_norm=0.5,
                          fused_adam=fast or compiled, compile=compiled),
            policy=ActorCriticConfig(actor_hidden=s.hidden, critic_hidden=s.hidden,
                                     activation="tanh-fast" if fast or compiled else "tanh", normalize_obs=False))
        cfg.max_episode_steps = 1000 if not is_adapter_task(task) else None
        cfg.validate()
        runner = OnPolicyRunner(cfg)
        from contextlib import redirect_stdout
        from io import StringIO

        first_iteration_s: list[float] = []
        if compiled:  # time the first iteration (it compiles) apart from the rest
            train_iteration = runner.train_iteration

            def timed_iteration() -> dict[str, float]:
                start = time.perf_counter()
                metrics = train_iteration()
                if not first_iteration_s:
                    first_iteration_s.append(time.perf_counter() - start)
                return metrics

            runner.train_iteration = timed_iteration
        with redirect_stdout(StringIO()):
            summary = runner.learn()
        runner.env.close()
    if compiled:
        per_iteration = s.num_envs * s.rollout_steps
        return {"env_steps": summary["env_steps"] - per_iteration, "seconds": runner.wall_time - first_iteration_s[0],
                "first_iteration_s": first_iteration_s[0]}
    return {"env_steps": summary["env_steps"], "seconds": runner.wall_time}


def ppo_sb3(s: PeerSettings) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(s.gym_id, n_envs=s.num_envs, seed=0)
    model = PPO("MlpPolicy", env, n_steps=s.rollout_steps, batch_size=s.minibatch_size, n_epochs=s.num_epochs,
                learning_rate=s.lr, gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5,
                max_grad_norm=0.5, device="cpu", seed=0, verbose=0,
                policy_kwargs={"net_arch": {"pi": list(s.hidden), "vf": list(s.hidden)}, "activation_fn": torch.nn.Tanh})
    steps = s.iterations * s.num_envs * s.rollout_steps
    torch.set_num_threads(s.update_threads)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    seconds = time.perf_counter() - start
    env.close()
    return {"env_steps": steps, "seconds": seconds}


def _rsl_rl_env(s: PeerSettings):
    """gymnasium's SyncVectorEnv behind rsl_rl's VecEnv interface (TensorDict observations, time_outs in extras)."""
    import gymnasium
    from rsl_rl.env import VecEnv
    from tensordict import TensorDict

    class GymVecEnv(VecEnv):
        def __init__(self):
            self.env = gymnasium.make_vec(s.gym_id, num_envs=s.num_envs, vectorization_mode="sync",
                                          vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP})
            obs, _ = self.env.reset(seed=0)
            self.obs = torch.as_tensor(obs, dtype=torch.float32)
            self.num_envs, self.num_actions = s.num_envs, self.env.single_action_space.shape[0]
            self.max_episode_length = 1000
            self.episode_length_buf = torch.zeros(s.num_envs, dtype=torch.long)
            self.device, self.cfg = "cpu", {}

        def get_observations(self):
            return TensorDict({"policy": self.obs}, batch_size=[self.num_envs])

        def step(self, actions):
            obs, reward, terminated, truncated, _ = self.env.step(actions.clamp(-1.0, 1.0).numpy().astype(np.float64))
            self.obs = torch.as_tensor(obs, dtype=torch.float32)
            done = torch.as_tensor(terminated | truncated)
            self.episode_length_buf = torch.where(done, 0, self.episode_length_buf + 1)
            extras = {"time_outs": torch.as_tensor(truncated & ~terminated)}
            return self.get_observations(), torch.as_tensor(reward, dtype=torch.float32), done.long(), extras

    return GymVecEnv()


def ppo_rsl_rl(s: PeerSettings) -> dict:
    from contextlib import redirect_stdout
    from io import StringIO

    from rsl_rl.runners import OnPolicyRunner

    model = {"class_name": "MLPModel", "hidden_dims": list(s.hidden), "activation": "tanh", "obs_normalization": False}
    cfg = {
        "num_steps_per_env": s.rollout_steps, "save_interval": 10**9, "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "multi_gpu": None, "check_for_nan": True,
        "algorithm": {"class_name": "PPO", "num_learning_epochs": s.num_epochs, "num_mini_batches": s.num_minibatches,
                      "clip_param": 0.2, "gamma": 0.99, "lam": 0.95, "value_loss_coef": 0.5, "entropy_coef": 0.0,
                      "learning_rate": s.lr, "max_grad_norm": 0.5, "use_clipped_value_loss": True, "schedule": "fixed",
                      "desired_kl": 0.01},
        "actor": {**model, "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": model,
    }
    env = _rsl_rl_env(s)
    with redirect_stdout(StringIO()):  # it prints the models and a log block per iteration
        runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
        torch.set_num_threads(s.update_threads)
        start = time.perf_counter()
        runner.learn(s.iterations)
        seconds = time.perf_counter() - start
    env.env.close()
    return {"env_steps": s.iterations * s.num_envs * s.rollout_steps, "seconds": seconds}


# ---------------------------------------------------------------- raw stepping
def _timed_steps(step: Callable[[int], None], num_envs: int, seconds: float) -> dict:
    step(0)  # warm up
    k, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        k += 1
        step(k)
    elapsed = time.perf_counter() - start
    return {"env_steps": k * num_envs, "seconds": elapsed}


def _actions(n: int, dim: int, dtype=np.float32) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, (n, dim)).astype(dtype) for _ in range(8)]


def raw_rlrobot(s: PeerSettings, n: int, vecenv: bool) -> dict:
    env = rlrobot.make(f"mujoco-{s.gym_id}", n, seed=0, num_threads=s.num_threads or None)
    env.reset(seed=0)
    acts = [torch.from_numpy(a) for a in _actions(n, env.action_dim)]
    try:
        if vecenv:
            return _timed_steps(lambda k: env.step(acts[k % 8]), n, s.raw_seconds)
        env.ctrl[:] = acts[0].numpy()
        return _timed_steps(lambda k: env.raw_step(), n, s.raw_seconds)
    finally:
        env.close()


def raw_envpool(s: PeerSettings, n: int) -> dict:
    import envpool

    env = envpool.make_gymnasium(s.gym_id, num_envs=n, num_threads=min(_threads(s), n), seed=0)
    env.reset()
    acts = _actions(n, env.action_space.shape[0], np.float64)
    result = _timed_steps(lambda k: env.step(acts[k % 8]), n, s.raw_seconds)
    env.close()
    return result


def raw_gymnasium(s: PeerSettings, n: int) -> dict:
    import gymnasium

    env = gymnasium.make_vec(s.gym_id, num_envs=n, vectorization_mode="sync")
    env.reset(seed=0)
    acts = _actions(n, env.single_action_space.shape[0], np.float64)
    result = _timed_steps(lambda k: env.step(acts[k % 8]), n, s.raw_seconds)
    env.close()
    return result


# ---------------------------------------------------------------- SAC updates
def sac_rlrobot(s: PeerSettings) -> dict:
    with tempfile.TemporaryDirectory(prefix="rlrobot-peers-sac-") as out:
        cfg = preset(f"mujoco-{s.gym_id}", "sac")
        cfg.out, cfg.logger, cfg.torch_threads, cfg.update_threads = out, "none", s.update_threads, s.update_threads
        cfg.sac.learning_starts, cfg.sac.rollout_steps, cfg.sac.buffer_size = 1_000, 1_000, 10_000
        runner = OffPolicyRunner(cfg)
        runner.obs, _ = runner.env.reset(seed=0)
        runner._collect()  # 1,000 random transitions
        gen = runner.generator
        batch = runner.replay.sample(cfg.sac.batch_size, gen)
        runner.algo.update(batch, gen)  # warm up
        start = time.perf_counter()
        for _ in range(s.sac_updates):
            runner.algo.update(runner.replay.sample(cfg.sac.batch_size, gen), gen)
        seconds = time.perf_counter() - start
        runner.env.close()
    return {"updates": s.sac_updates, "seconds": seconds}


def sac_sb3(s: PeerSettings) -> dict:
    import gymnasium
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", gymnasium.make(s.gym_id), batch_size=256, learning_starts=1_000, buffer_size=10_000,
                device="cpu", seed=0, verbose=0, policy_kwargs={"net_arch": [256, 256]})
    model.learn(total_timesteps=1_000)  # fills the buffer with 1,000 random transitions, no updates yet
    torch.set_num_threads(s.update_threads)
    model.train(gradient_steps=1, batch_size=256)  # warm up
    start = time.perf_counter()
    model.train(gradient_steps=s.sac_updates, batch_size=256)
    seconds = time.perf_counter() - start
    model.env.close()
    return {"updates": s.sac_updates, "seconds": seconds}


# ---------------------------------------------------------------- the interleaved run
def contestants(s: PeerSettings) -> dict[str, Callable[[], dict]]:
    runs: dict[str, Callable[[], dict]] = {
        "ppo_rlrobot_native": lambda: ppo_rlrobot(s, f"mujoco-{s.gym_id}"),
        **({"ppo_rlrobot_native_fast": lambda: ppo_rlrobot(s, f"mujoco-{s.gym_id}", fast=True)} if s.fast_row else {}),
        **({"ppo_rlrobot_native_compiled": lambda: ppo_rlrobot(s, f"mujoco-{s.gym_id}", compiled=True)}
           if s.compile_row else {}),
        "ppo_rlrobot_gym_adapter": lambda: ppo_rlrobot(s, f"gym:{s.gym_id}"),
        "ppo_sb3": lambda: ppo_sb3(s),
        "ppo_rsl_rl": lambda: ppo_rsl_rl(s),
        "sac_rlrobot": lambda: sac_rlrobot(s),
        "sac_sb3": lambda: sac_sb3(s),
    }
    for n in s.raw_num_envs:
        runs[f"raw_rlrobot_physics_{n}"] = lambda n=n: raw_rlrobot(s, n, vecenv=False)
        runs[f"raw_rlrobot_vecenv_{n}"] = lambda n=n: raw_rlrobot(s, n, vecenv=True)
        runs[f"raw_envpool_{n}"] = lambda n=n: raw_envpool(s, n)
        runs[f"raw_gymnasium_sync_{n}"] = lambda n=n: raw_gymnasium(s, n)
    return runs


RATIOS = (  # (name, numerator, denominator)
    ("PPO train: rlrobot native / SB3", "ppo_rlrobot_native", "ppo_sb3"),
    ("PPO train: rlrobot native / rsl_rl", "ppo_rlrobot_native", "ppo_rsl_rl"),
    ("PPO train: rlrobot native fast (tanh-fast, fused Adam) / SB3", "ppo_rlrobot_native_fast", "ppo_sb3"),
    ("PPO train: rlrobot native fast (tanh-fast, fused Adam) / rsl_rl", "ppo_rlrobot_native_fast", "ppo_rsl_rl"),
    ("PPO train: rlrobot native compiled (fast + torch.compile, after its first iteration) / SB3",
     "ppo_rlrobot_native_compiled", "ppo_sb3"),
    ("PPO train: rlrobot native compiled (fast + torch.compile, after its first iteration) / rsl_rl",
     "ppo_rlrobot_native_compiled", "ppo_rsl_rl"),
    ("PPO train: rlrobot gym adapter / SB3", "ppo_rlrobot_gym_adapter", "ppo_sb3"),
    ("SAC updates/s: rlrobot / SB3", "sac_rlrobot", "sac_sb3"),
)


def run_peers_bench(s: PeerSettings, only: tuple[str, ...] = (), progress_json: str | None = None) -> dict:
    """Every contestant once per round, round after round; ``only`` keeps the runs whose names start with one of
    its prefixes. Each sample is printed as it lands and, with ``progress_json``, the samples so far are written
    after each round (a run cut short still leaves its figures)."""
    import json

    missing = missing_peers()
    if missing:
        raise ImportError(f"rlrobot bench --peers needs {', '.join(missing)}: {BENCH_EXTRA}")
    torch.set_num_threads(1)
    runs = contestants(s)
    if only:
        runs = {k: v for k, v in runs.items() if any(k.startswith(o) for o in only)}
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for round_ in range(s.rounds):
        for name, fn in runs.items():  # round-robin: every library sees the same machine load in each round
            r = fn()
            samples[name].append((r.get("env_steps") or r["updates"]) / r["seconds"])
            first = f", first iteration {r['first_iteration_s']:.1f} s" if "first_iteration_s" in r else ""
            console.print(f"round {round_ + 1}/{s.rounds}  {name}: {samples[name][-1]:,.1f}/s ({r['seconds']:.1f} s{first})")
        if progress_json:
            with open(progress_json, "w") as f:
                json.dump({"settings": asdict(s), "samples": samples}, f, indent=2)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    ratios = {label: medians[a] / medians[b] for label, a, b in RATIOS if a in medians and b in medians}
    for n in s.raw_num_envs:
        for ours in ("physics", "vecenv"):
            a, b = f"raw_rlrobot_{ours}_{n}", f"raw_envpool_{n}"
            if a in medians and b in medians:
                ratios[f"raw {n} envs: rlrobot {ours} / EnvPool"] = medians[a] / medians[b]
    result = {"settings": asdict(s), "threads": _threads(s), "samples": samples, "median": medians, "ratios": ratios}
    _print(result)
    return result


def _print(result: dict) -> None:
    from rich.table import Table

    s = result["settings"]
    table = Table(title=f"peers on {s['gym_id']}: median of {s['rounds']} interleaved rounds (env steps/s; SAC: updates/s)")
    for col in ("run", "median", "samples"):
        table.add_column(col, justify="right")
    for k, v in result["median"].items():
        table.add_row(k, f"{v:,.0f}", " ".join(f"{x:,.0f}" for x in result["samples"][k]))
    console.print(table)
    ratios = Table(title="ratios (medians)")
    ratios.add_column("ratio")
    ratios.add_column("value", justify="right")
    for k, v in result["ratios"].items():
        ratios.add_row(k, f"{v:.2f}")
    console.print(ratios)
