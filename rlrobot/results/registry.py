"""The benchmark registry: every figure of the README's Results table is an entry here, and ``rlrobot results run``
reproduces it (``results/<name>.json``), from which ``rlrobot results table`` writes the README table and the PNGs.

An entry is a pipeline of ``rlrobot`` command lines (collect, train, experts, bench) run once per seed. Placeholders
in a step's argv: ``{seed}`` (the seed), ``{out}`` (this step's output: a directory, or a ``.json`` file for
experts / bench steps) and ``{<step>}`` (an earlier step's output, e.g. ``--init {sft}``). Figures are named
``<step>.<metric>``; what each step kind measures is in ``rlrobot.results.runner.step_figures``.

Later issues add their entries to ``ENTRIES`` (one ``Entry(...)``); nothing else needs to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlrobot.tasks.so101_variants import STUDY_VARIANTS

StepKind = Literal["train", "collect", "eval", "experts", "bench", "deploy"]


@dataclass(frozen=True)
class Step:
    name: str
    """short name: the step's output is <seed dir>/<name> (a directory, or <name>.json for experts / bench)"""
    kind: StepKind
    argv: tuple[str, ...]
    """the rlrobot command line (without ``rlrobot``), with {seed}, {out} and {<earlier step>} placeholders"""

    @property
    def output_is_file(self) -> bool:
        return self.kind in ("experts", "bench", "deploy")


@dataclass(frozen=True)
class Figure:
    key: str
    """<step>.<metric> (see rlrobot.results.runner.step_figures)"""
    label: str
    fmt: str = ".2f"
    per_seed: bool = False
    """also list each seed's value in the table (headline figures)"""


@dataclass(frozen=True)
class Entry:
    name: str
    """results/<name>.json; rlrobot results run --only <name>"""
    title: str
    """what the row is (the README table's first column)"""
    task: str
    """the task whose learning-curve PNG shows this entry (results/<task>.png)"""
    steps: tuple[Step, ...]
    figures: tuple[Figure, ...]
    budget: str
    """the budget in words (env steps, updates, episodes)"""
    seeds: int = 1
    """seeds 0..seeds-1 by default; headline rows use >= 3 (mean +- std)"""
    cost: str = ""
    """wall clock per seed on the development machine (2 CPU cores), for planning"""
    target: str = ""
    curve: str = ""
    """<step>.<metric of metrics.jsonl> plotted in the task's PNG (e.g. train.eval/success_rate); '' = none"""
    group: Literal["headline", "benchmark", "study"] = "benchmark"
    notes: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    algos: tuple[str, ...] = ()
    """the registered algorithms (``--algo`` names) whose documentation pages list this entry's figures"""


def _train(task: str, algo: str, *flags: str, name: str = "train") -> Step:
    return Step(name, "train", ("train", "--task", task, "--algo", algo, "--seed", "{seed}", "--out", "{out}",
                                "--no-video", *flags))


SUCCESS = Figure("train.success", "eval success", ".2f", per_seed=True)
RETURN = Figure("train.return", "return", ".1f")
ENV_STEPS = Figure("train.env_steps", "env steps", ",.0f")
TRAIN_WALL = Figure("train.wall_s", "training s", ".0f")
PPO_LIFT_FIGURES = (SUCCESS, RETURN, Figure("train.peak_success", "peak eval success", ".2f"),
                    Figure("train.train_success", "training success (last 200 episodes)", ".2f"), TRAIN_WALL)
# the earlier so101-lift PPO preset (before the staged-reward recipe), pinned for the rows that were run with it
OLD_PPO_LIFT_FLAGS = ("--num-envs", "128", "--ppo.rollout-steps", "24", "--ppo.gamma", "0.99", "--ppo.lam", "0.95",
                      "--ppo.num-epochs", "5", "--ppo.num-minibatches", "4", "--ppo.lr", "1e-3", "--ppo.lr-schedule",
                      "adaptive", "--policy.actor-hidden", "256", "128", "64", "--policy.critic-hidden", "256", "128", "64",
                      "--policy.activation", "elu", "--update-threads", "0")
SPARSE_PPO_LIFT_FLAGS = ("--reward-mode", "sparse", "--total-steps", "2000000", "--policy.init-noise-std", "0.5",
                         "--ppo.entropy-coef", "0", "--eval-every", "10", "--eval-episodes", "32", *OLD_PPO_LIFT_FLAGS)

# The SFT and Flow-Noise presets of so101-lift as flags, for the contact-study variants of the task (presets are
# looked up by task name; tests/results check these flags rebuild the presets exactly).
SFT_LIFT_FLAGS = ("--num-envs", "1", "--sft.num-updates", "2000", "--eval-episodes", "64", "--checkpoint-every", "10")
FLOW_NOISE_LIFT_FLAGS = ("--num-envs", "64", "--total-steps", "1600000", "--flow-ppo.rollout-chunks", "10",
                         "--flow-ppo.critic-warmup-iterations", "2", "--eval-every", "50", "--eval-episodes", "64")


def lift_pipeline(name: str, title: str, task: str = "so101-lift", seeds: int = 3, group: str = "headline",
                  notes: str = "", algos: tuple[str, ...] = ("sft", "flow-noise")) -> Entry:
    """10 expert demos -> few-shot SFT -> Flow-Noise PPO from the SFT checkpoint, every step seeded with {seed}."""
    variant = task != "so101-lift"
    collect = Step("data", "collect", ("collect", "--task", task, "--episodes", "10", "--success-only",
                                       "--out", "{out}", "--seed", "{seed}"))
    sft = Step("sft", "train", ("train", "--algo", "sft", "--task", task, "--dataset", "{data}", "--out", "{out}",
                                "--seed", "{seed}", "--no-video", *(SFT_LIFT_FLAGS if variant else ())))
    flow = Step("flow", "train", ("train", "--algo", "flow-noise", "--task", task, "--init", "{sft}",
                                  "--out", "{out}", "--seed", "{seed}", "--no-video",
                                  *(FLOW_NOISE_LIFT_FLAGS if variant else ())))
    return Entry(
        name=name, title=title, task="so101-lift", steps=(collect, sft, flow), seeds=seeds, group=group,  # type: ignore[arg-type]
        figures=(Figure("flow.success", "Flow-Noise eval success", ".3f", per_seed=True),
                 Figure("flow.peak_success", "peak during training", ".3f"),
                 Figure("sft.success", "SFT S0", ".3f", per_seed=True),
                 Figure("data.expert_success", "expert in collection", ".2f"),
                 Figure("flow.wall_s", "Flow-Noise training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 1.6M env steps Flow-Noise PPO",
        cost="~11 min per seed on the idle machine (SFT 1 min, Flow-Noise 10 min)", target=">= 0.9 mean over 3 seeds",
        curve="flow.eval/success_rate", notes=notes, algos=algos)


def _contact_study(variant: str, what: str) -> tuple[Entry, Entry]:
    """The lift pipeline and the push-expert flung-cube check on one contact / floor variant of the tasks."""
    lift = lift_pipeline(f"study-lift-{variant}", f"contact study: SFT + Flow-Noise so101-lift, {what}",
                         task=f"so101-lift-{variant}", group="study", algos=())
    experts = Entry(
        name=f"study-experts-{variant}", title=f"contact study: scripted push / lift experts, {what}",
        task="so101-push", group="study", seeds=1,
        steps=(Step("experts", "experts", ("results", "experts", "--tasks", f"so101-push-{variant}",
                                           f"so101-lift-{variant}", "--episodes", "256", "--seed", "{seed}",
                                           "--json-out", "{out}")),
               Step("noisy", "experts", ("results", "experts", "--tasks", f"so101-push-{variant}", "--episodes", "768",
                                         "--noise", "0.3", "--seed", "{seed}", "--json-out", "{out}"))),
        figures=(Figure(f"experts.so101-push-{variant}.success", "push expert success (256)", ".3f"),
                 Figure(f"experts.so101-push-{variant}.lost", "push expert cube lost", ".3f"),
                 Figure(f"experts.so101-lift-{variant}.success", "lift expert success (256)", ".3f"),
                 Figure(f"noisy.so101-push-{variant}.lost", "noisy push expert (0.3) cube lost (768)", ".3f")),
        budget="256 expert episodes per task; 768 noisy-expert episodes", cost="~1 min")
    return lift, experts


EXPERT_TASKS = ("so101-reach", "so101-push", "so101-lift")

def _ppo_locomotion(robot: str, target: str, cost: str) -> Entry:
    """PPO at the native locomotion preset (``configs/ppo_mujoco_<robot>_v5.py``), 1M env steps, 3 seeds."""
    task = f"mujoco-{robot}-v5"
    return Entry(name=f"ppo-mujoco-{robot.lower()}", title=f"PPO {task} (native batched), preset: CleanRL's MuJoCo PPO "
                 "settings", task=task, seeds=3, steps=(_train(task, "ppo"),),
                 figures=(Figure("train.return", "eval return (8 episodes, deterministic)", ",.0f", per_seed=True),
                          ENV_STEPS, TRAIN_WALL),
                 budget="1M env steps (999k: whole iterations)", cost=f"{cost} per seed idle", target=target,
                 curve="train.eval/return_mean", algos=("ppo",))


ENTRIES: tuple[Entry, ...] = (
    Entry(name="ppo-so101-reach", title="PPO so101-reach, preset", task="so101-reach", group="headline", seeds=3,
          steps=(_train("so101-reach", "ppo"),), figures=(SUCCESS, RETURN, ENV_STEPS, TRAIN_WALL),
          budget="500k env steps (498k: whole iterations)", cost="~1.5 min per seed idle", target=">= 0.95",
          curve="train.eval/success_rate", algos=("ppo",)),
    Entry(name="sac-so101-reach", title="SAC so101-reach, preset", task="so101-reach", group="headline", seeds=3,
          steps=(_train("so101-reach", "sac"),), figures=(SUCCESS, RETURN, ENV_STEPS, TRAIN_WALL),
          budget="40k env steps", cost="~3.5 min per seed idle (update-bound)", target=">= 0.95",
          curve="train.eval/success_rate", algos=("sac",)),
    Entry(name="sac-gym-pendulum", title="SAC gym:Pendulum-v1, preset", task="gym:Pendulum-v1", seeds=3,
          steps=(_train("gym:Pendulum-v1", "sac"),),
          figures=(Figure("train.return", "eval return (8 episodes)", ".1f", per_seed=True), TRAIN_WALL),
          budget="20k env steps", cost="~1.5 min per seed idle", target="return >= -200 (random: about -1200)",
          curve="train.eval/return_mean", algos=("sac",)),
    Entry(name="experts", title="scripted experts (ee_delta)", task="so101-push", seeds=1,
          steps=(Step("experts64", "experts", ("results", "experts", "--tasks", *EXPERT_TASKS, "--episodes", "64",
                                               "--seed", "{seed}", "--json-out", "{out}")),
                 Step("experts256", "experts", ("results", "experts", "--tasks", *EXPERT_TASKS, "--episodes", "256",
                                                "--seed", "{seed}", "--json-out", "{out}")),
                 Step("noisy", "experts", ("results", "experts", "--tasks", "so101-push", "--episodes", "768", "--noise",
                                           "0.3", "--seed", "{seed}", "--json-out", "{out}"))),
          figures=tuple(Figure(f"experts64.{t}.success", f"{t.removeprefix('so101-')} (64)", ".2f") for t in EXPERT_TASKS)
          + tuple(Figure(f"experts256.{t}.success", f"{t.removeprefix('so101-')} (256)", ".3f") for t in EXPERT_TASKS)
          + (Figure("experts256.so101-push.lost", "push cube lost (256)", ".3f"),
             Figure("noisy.so101-push.lost", "noisy push expert (0.3) cube lost (768)", ".3f")),
          budget="64 and 256 seeded episodes per task; 768 noisy push-expert episodes", cost="~2 min idle",
          target="push >= 0.99 over 256 episodes"),
    lift_pipeline("sft-flow-noise-so101-lift", "SFT + Flow-Noise PPO so101-lift (10 demos)"),
    Entry(name="sac-so101-push", title="SAC so101-push, preset", task="so101-push", seeds=1,
          steps=(_train("so101-push", "sac"),), figures=(SUCCESS, RETURN, TRAIN_WALL),
          budget="400k env steps", cost="~40 min per seed idle", target=">= 0.9", curve="train.eval/success_rate",
          algos=("sac",)),
    Entry(name="ppo-so101-lift", title="PPO so101-lift from scratch, preset: ManiSkill3 PickCube's staged reward and "
          "PPO settings (gamma 0.8, lambda 0.9, no entropy, std 0.6, 128 envs x 50 steps, 3x256 tanh)",
          task="so101-lift", seeds=3, group="headline", steps=(_train("so101-lift", "ppo"),),
          figures=PPO_LIFT_FIGURES, budget="1.5M env steps", cost="~15 min per seed on one idle core",
          target=">= 0.8", curve="train.eval/success_rate", algos=("ppo",)),
    Entry(name="ppo-so101-lift-dense-reward", title="study: the PPO lift preset with our dense reward instead of the "
          "staged one (what the reward does)", task="so101-lift", seeds=1, group="study",
          steps=(_train("so101-lift", "ppo", "--reward-mode", "dense"),), figures=PPO_LIFT_FIGURES,
          budget="1.5M env steps", cost="~15 min per seed on one idle core", curve="train.eval/success_rate",
          algos=("ppo",)),
    Entry(name="ppo-so101-lift-default-ppo", title="study: the staged reward with the earlier preset's PPO settings "
          "(gamma 0.99, lambda 0.95, entropy 0.01, std 1.0, 24-step rollouts, lr 1e-3 adaptive, 256-128-64 ELU; what "
          "the settings do)", task="so101-lift", seeds=1, group="study",
          steps=(_train("so101-lift", "ppo", *OLD_PPO_LIFT_FLAGS[:-2], "--ppo.entropy-coef", "0.01",
                        "--policy.init-noise-std", "1.0"),),
          figures=PPO_LIFT_FIGURES, budget="1.5M env steps", cost="~15 min per seed on one idle core",
          curve="train.eval/success_rate", algos=("ppo",)),
    Entry(name="ppo-maniskill-pushcube", title="PPO maniskill:PushCube-v1 (state, CPU sim, 16 envs), preset",
          task="maniskill:PushCube-v1", seeds=1, steps=(_train("maniskill:PushCube-v1", "ppo"),),
          figures=(Figure("train.train_success", "training success (last episodes)", ".2f", per_seed=True),
                   SUCCESS, TRAIN_WALL),
          budget="200k env steps", cost="~7 min idle (extra: maniskill)", curve="train.eval/success_rate",
          algos=("ppo",)),
    _ppo_locomotion("HalfCheetah", "CleanRL's published PPO HalfCheetah figure (2,906 on v4) or better", "~8 min"),
    _ppo_locomotion("Hopper", "CleanRL's published PPO Hopper-v4 figure (2,383 +- 272) or better", "~7 min"),
    _ppo_locomotion("Walker2d", "CleanRL's published PPO Walker2d-v4 figure (2,288 +- 572) or better", "~7 min"),
    _ppo_locomotion("Ant", "reported (CleanRL's v4 PPO table has no Ant row)", "~12 min"),
    Entry(name="sac-mujoco-halfcheetah-300k", title="SAC mujoco-HalfCheetah-v5 (native batched), preset: CleanRL / SB3 "
          "SAC settings, 300k env steps", task="mujoco-HalfCheetah-v5", seeds=1,
          steps=(_train("mujoco-HalfCheetah-v5", "sac", "--total-steps", "300000", "--update-threads", "1"),),
          figures=(Figure("train.return", "eval return (8 episodes, deterministic)", ",.0f", per_seed=True),
                   ENV_STEPS, TRAIN_WALL),
          budget="300k env steps = 295k gradient updates (a third of the usual 1M: SAC is update-bound here)",
          cost="~1 h per seed idle", target="reported", curve="train.eval/return_mean", algos=("sac",)),
    Entry(name="bench-so101-reach", title="bench: so101-reach env steps/s at 64 / 256 / 1024 envs (raw mj_step, VecEnv, "
          "PPO training) and SAC at its preset", task="so101-reach", seeds=1,
          steps=(Step("bench", "bench", ("bench", "--json-out", "{out}")),),
          figures=tuple(Figure(f"bench.ppo.{i}.{k}", f"{what} @{n}", ",.0f") for i, n in enumerate((64, 256, 1024))
                        for k, what in (("raw_steps_per_s", "mj_step"), ("vecenv_steps_per_s", "VecEnv"),
                                        ("ppo_steps_per_s", "PPO"))) +
          (Figure("bench.sac.sac_env_steps_per_s", "SAC training", ",.0f"),
           Figure("bench.sac.sac_updates_per_s", "SAC updates/s", ",.0f")),
          budget="3 s per figure", cost="~2 min"),
    Entry(name="bench-mjwarp-cpu", title="bench: MuJoCo Warp on Warp's CPU device vs native MuJoCo, so101-reach, "
          "env steps/s at 16 / 64 envs", task="so101-reach", seeds=1,
          steps=(Step("bench", "bench", ("bench", "--backend", "mjwarp", "--device", "cpu", "--num-envs", "16", "64",
                                         "--json-out", "{out}")),),
          figures=tuple(Figure(f"bench.rows.{i}.{k}", f"{what} @{n}", ",.0f") for i, n in enumerate((16, 64))
                        for k, what in (("native_raw_steps_per_s", "native mj_step"), ("warp_raw_steps_per_s", "Warp step"),
                                        ("warp_vecenv_steps_per_s", "Warp VecEnv"), ("warp_ppo_steps_per_s", "PPO on Warp"))),
          budget="3 s per figure", cost="~3 min (extra: mjwarp)", notes="Warp's CPU device is for correctness checks"),
    Entry(name="bench-maniskill", title="bench: ManiSkill PushCube-v1 CPU sim vs our adapter, env steps/s at 1 / 8 envs",
          task="maniskill:PushCube-v1", seeds=1,
          steps=(Step("bench", "bench", ("bench", "--backend", "maniskill", "--num-envs", "1", "8", "--json-out", "{out}")),),
          figures=tuple(Figure(f"bench.rows.{i}.{k}", f"{what} @{n}", ",.0f") for i, n in enumerate((1, 8))
                        for k, what in (("sim_steps_per_s", "ManiSkill"), ("vecenv_steps_per_s", "adapter"))),
          budget="3 s per figure", cost="~2 min (extra: maniskill)"),
    Entry(name="deploy-twin-ppo-so101-reach", title="deploy: PPO so101-reach served over loopback to the twin, real "
          "time, default safety limits", task="so101-reach", seeds=1,
          steps=(_train("so101-reach", "ppo"),
                 Step("deploy", "deploy", ("results", "deploy-twin", "--checkpoint", "{train}", "--episodes", "20",
                                            "--seed", "500", "--json-out", "{out}"))),
          figures=(Figure("deploy.success_rate", "twin success (20 episodes)", ".2f"),
                   Figure("deploy.changed_commands", "commands changed by the supervisor", ".3f"),
                   Figure("deploy.round_trip_median_ms", "round trip median ms", ".1f"),
                   Figure("train.success", "simulation eval success", ".2f")),
          budget="the PPO reach preset, then 20 twin episodes", cost="~3 min"),
)

# The contact / floor study: old (0.005) vs new (0.03) contacts, with and without the Cartesian floor,
# and stiff jaw/cube contacts with the soft cube/table pair. Variant tasks: rlrobot.tasks.so101_variants.
ENTRIES = ENTRIES + tuple(e for variant, (what, _) in STUDY_VARIANTS.items() for e in _contact_study(variant, what))

# JSRL: sparse-reward so101-lift, PPO with the scripted expert / a 10-demo SFT flow checkpoint as the guide,
# and PPO from scratch on the same sparse reward and settings (the baseline that stays at zero).
_JSRL_FIGURES = (SUCCESS, Figure("train.peak_success", "peak eval success", ".2f"),
                 Figure("train.train_success", "training success (last 200 episodes)", ".2f"), TRAIN_WALL)


def _demos_and_sft(task: str = "so101-lift") -> tuple[Step, Step]:
    """10 successful expert demos of `task` and the flow policy's SFT preset on them (the flow-RL rows' start)."""
    collect = Step("data", "collect", ("collect", "--task", task, "--episodes", "10", "--success-only", "--out",
                                       "{out}", "--seed", "{seed}"))
    sft = Step("sft", "train", ("train", "--algo", "sft", "--task", task, "--dataset", "{data}", "--out", "{out}",
                                "--seed", "{seed}", "--no-video"))
    return collect, sft


def _jsrl_sft_lift() -> Entry:
    collect, sft = _demos_and_sft()
    return Entry(name="jsrl-ppo-so101-lift-sft", title="JSRL: PPO so101-lift, sparse reward, 10-demo SFT flow guide",
                 task="so101-lift", steps=(collect, sft, _train("so101-lift", "ppo", *SPARSE_PPO_LIFT_FLAGS, "--jsrl.guide",
                                                                "{sft}", "--jsrl.tolerance", "0.2")),
                 figures=(*_JSRL_FIGURES, Figure("sft.success", "SFT guide alone", ".3f")),
                 budget="10 demos, 2,000 SFT updates, 2M env steps PPO", seeds=2,
                 cost="~12 min per seed on one idle core (~30 min on the shared machine)",
                 target=">= 0.8", curve="train.eval/success_rate", group="study", algos=("ppo",))


ENTRIES = ENTRIES + (
    Entry(name="jsrl-ppo-so101-lift-expert", title="JSRL: PPO so101-lift, sparse reward, scripted-expert guide "
          "(H = 100 in 10 stages, tolerance 0.2)", task="so101-lift",
          steps=(_train("so101-lift", "ppo", *SPARSE_PPO_LIFT_FLAGS, "--jsrl.guide", "expert", "--jsrl.tolerance", "0.2"),),
          figures=_JSRL_FIGURES, budget="2M env steps", seeds=3,
          cost="~10 min per seed on one idle core (~27 min on the shared machine)", target=">= 0.8",
          curve="train.eval/success_rate", group="study", algos=("ppo",)),
    _jsrl_sft_lift(),
    Entry(name="ppo-so101-lift-sparse", title="PPO so101-lift from scratch, sparse reward, the JSRL runs' PPO settings",
          task="so101-lift", steps=(_train("so101-lift", "ppo", *SPARSE_PPO_LIFT_FLAGS),), figures=_JSRL_FIGURES,
          budget="2M env steps", seeds=3, cost="~8 min per seed on one idle core (~25 min on the shared machine)",
          curve="train.eval/success_rate", group="study", algos=("ppo",)),
)


# of 10 LayerNorm critics, then WSRL / Cal-QL online keeping the data / RLPD / SAC from scratch at the same sizes
# (64x64 MLPs, 10 critics, UTD 0.5, batch 256, 22,528 env steps; the presets configs/{wsrl,cal_ql_online,rlpd}_*.py).
WARM_START_SAC_FLAGS = ("--num-envs", "16", "--total-steps", "22528", "--update-threads", "1", "--sac.gamma", "0.97",
                        "--sac.utd", "0.5", "--sac.batch-size", "256", "--sac.learning-starts", "2048",
                        "--sac.rollout-steps", "16", "--sac.buffer-size", "200000", "--sac.num-target-critics", "2",
                        "--sac.actor-q", "mean", "--policy.actor-hidden", "64", "64", "--policy.critic-hidden", "64", "64",
                        "--policy.activation", "relu", "--policy.num-critics", "10", "--policy.critic-layer-norm",
                        "--checkpoint-every", "8", "--eval-every", "8", "--eval-episodes", "64", "--eval-envs", "32")
CAL_QL_ENSEMBLE_FLAGS = ("--cal-ql.gradient-steps", "3000", "--cal-ql.updates-per-iteration", "500", "--cal-ql.gamma",
                         "0.97", "--cal-ql.num-critics", "10", "--cal-ql.num-target-critics", "2",
                         "--cal-ql.critic-layer-norm", "--cal-ql.actor-q", "mean", "--cal-ql.num-actions", "2",
                         "--cal-ql.init-alpha", "0.05", "--cal-ql.actor-lr", "3e-4", "--update-threads", "1",
                         "--eval-every", "1")


def warm_start_entry(task: str) -> Entry:
    sparse = ("--reward-mode", "sparse")
    data = Step("data", "collect", ("collect", "--task", task, "--recipe", "noisy", "--out", "{out}", "--seed", "{seed}"))
    steps = (data, _train(task, "cal-ql", "--dataset", "{data}", *sparse, *CAL_QL_ENSEMBLE_FLAGS, name="offline"),
             _train(task, "wsrl", "--init", "{offline}", *sparse, name="wsrl"),
             _train(task, "cal-ql-online", "--init", "{offline}", "--dataset", "{data}", *sparse, name="keep"),
             _train(task, "rlpd", "--dataset", "{data}", *sparse, name="rlpd"),
             _train(task, "sac", *sparse, *WARM_START_SAC_FLAGS, name="sac"))
    return Entry(
        name=f"warm-start-{task}-sparse", title=f"warm starts on sparse-reward {task}: Cal-QL (10-critic REDQ) -> WSRL vs "
        "Cal-QL online keeping the data vs RLPD vs SAC from scratch", task=task, seeds=1,
        steps=steps, figures=(Figure("offline.success", "Cal-QL offline", ".2f"),
                              Figure("wsrl.success", "WSRL", ".2f", per_seed=True),
                              Figure("keep.success", "keep the data", ".2f"), Figure("rlpd.success", "RLPD", ".2f"),
                              Figure("sac.success", "SAC from scratch", ".2f"), Figure("wsrl.wall_s", "WSRL training s", ".0f"),
                              Figure("keep.wall_s", "keep-data training s", ".0f")),
        budget="200 noisy episodes, 3,000 Cal-QL updates, 22,528 env steps online for each method",
        cost="~50 min per seed on the shared 2-core machine", target="WSRL: no dip at the switch, >= 0.9 first",
        curve="wsrl.eval/success_rate", algos=("cal-ql", "wsrl", "cal-ql-online", "rlpd", "sac"))


ENTRIES = ENTRIES + (warm_start_entry("so101-lift"), warm_start_entry("so101-push"))


# Flow-policy RL from one few-demo SFT checkpoint: Flow-Noise vs Flow-NFT (paired baseline) vs Flow-SDE, same budget
FLOW_RL_FLAGS = ("--total-steps", "960000", "--eval-every", "25", "--eval-episodes", "64")
NFT_PAIRED_FLAGS = ("--flow-nft.time-sampling", "beta", "--flow-nft.paired-baseline")


def _flow_rl_lift() -> Entry:
    collect, sft = _demos_and_sft()
    runs = tuple(_train("so101-lift", algo, "--init", "{sft}", *FLOW_RL_FLAGS, *flags, name=name)
                 for name, algo, flags in (("noise", "flow-noise", ()), ("nft", "flow-nft", NFT_PAIRED_FLAGS),
                                           ("sde", "flow-sde", ())))
    return Entry(
        name="flow-rl-so101-lift", title="flow-policy RL so101-lift from one 10-demo SFT: Flow-Noise vs Flow-NFT "
        "(paired baseline) vs Flow-SDE", task="so101-lift", steps=(collect, sft, *runs), group="study",
        figures=(Figure("sft.success", "SFT S0", ".3f"), Figure("noise.success", "Flow-Noise", ".3f", per_seed=True),
                 Figure("nft.success", "Flow-NFT", ".3f", per_seed=True), Figure("sde.success", "Flow-SDE", ".3f"),
                 Figure("noise.wall_s", "Flow-Noise training s", ".0f"), Figure("nft.wall_s", "Flow-NFT training s", ".0f"),
                 Figure("sde.wall_s", "Flow-SDE training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 960k env steps per RL method", cost="~35 min per seed on one idle core",
        target="NFT: as good or better than Flow-Noise, cheaper per update", curve="nft.eval/success_rate",
        algos=("sft", "flow-noise", "flow-nft", "flow-sde"))


# Flow-NFT with the paired baseline and Flow-Noise's stochastic sampler for its rollouts (exploration from the noise
# head instead of the initial noise alone), same SFT checkpoint and budget as flow-rl-so101-lift.
def _flow_nft_noise_lift() -> Entry:
    collect, sft = _demos_and_sft()
    nft = _train("so101-lift", "flow-nft", "--init", "{sft}", *FLOW_RL_FLAGS, *NFT_PAIRED_FLAGS, "--flow-nft.sampler",
                 "noise", name="nft")
    return Entry(
        name="flow-nft-noise-so101-lift", title="Flow-NFT so101-lift, paired baseline, rollouts with Flow-Noise's "
        "sampler (same SFT and budget as flow-rl-so101-lift)", task="so101-lift", steps=(collect, sft, nft),
        figures=(Figure("sft.success", "SFT S0", ".3f"), Figure("nft.success", "Flow-NFT (noise sampler)", ".3f", per_seed=True),
                 Figure("nft.peak_success", "peak during training", ".3f"), Figure("nft.wall_s", "training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 960k env steps", seeds=2, cost="~12 min per seed on one idle core",
        target="NFT: as good or better than Flow-Noise (0.844 in flow-rl-so101-lift)", curve="nft.eval/success_rate",
        group="study", algos=("flow-nft",))


# The same comparison on so101-push, NFT in its best measured form on lift (paired baseline,
# Flow-Noise's sampler for the rollouts), from one 10-demo SFT checkpoint per seed.
def _flow_rl_push() -> Entry:
    collect, sft = _demos_and_sft("so101-push")
    runs = tuple(_train("so101-push", algo, "--init", "{sft}", *FLOW_RL_FLAGS, *flags, name=name)
                 for name, algo, flags in (("noise", "flow-noise", ()),
                                           ("nft", "flow-nft", (*NFT_PAIRED_FLAGS, "--flow-nft.sampler", "noise")),
                                           ("sde", "flow-sde", ())))
    return Entry(
        name="flow-rl-so101-push", title="flow-policy RL so101-push from one 10-demo SFT: Flow-Noise vs Flow-NFT "
        "(paired baseline, noise sampler) vs Flow-SDE", task="so101-push", steps=(collect, sft, *runs), group="study",
        figures=(Figure("sft.success", "SFT S0", ".3f"), Figure("noise.success", "Flow-Noise", ".3f", per_seed=True),
                 Figure("nft.success", "Flow-NFT", ".3f", per_seed=True), Figure("sde.success", "Flow-SDE", ".3f",
                                                                                 per_seed=True),
                 Figure("noise.wall_s", "Flow-Noise training s", ".0f"), Figure("nft.wall_s", "Flow-NFT training s", ".0f"),
                 Figure("sde.wall_s", "Flow-SDE training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 960k env steps per RL method", seeds=3,
        cost="~23 min per seed on one core",
        target="NFT: as good or better than Flow-Noise, cheaper per update", curve="nft.eval/success_rate",
        algos=("sft", "flow-noise", "flow-nft", "flow-sde"))


def _evaluate(name: str, run: str, *flags: str) -> Step:
    """``rlrobot eval`` of an earlier step's run on 128 episodes (the same seeded episodes for every run)."""
    return Step(name, "eval", ("eval", "--checkpoint", run, "--episodes", "128", "--no-video", "--out", "{out}", *flags))


# PolicyTrim's execute-length curriculum: the SFT policy executes 2 of its 5-action chunks; Flow-NFT with the
# paired baseline grows the executed part while training success holds. Before / after on the same 128 episodes.
def _policytrim_lift() -> Entry:
    collect, sft = _demos_and_sft()
    trim = _train("so101-lift", "flow-nft", "--init", "{sft}", "--total-steps", "320000", "--eval-every", "25",
                  "--eval-episodes", "64", *NFT_PAIRED_FLAGS, "--trim.curriculum", "--flow.execute-steps", "2", name="trim")
    return Entry(
        name="policytrim-so101-lift", title="PolicyTrim execute-length curriculum on so101-lift: 10-demo SFT executing "
        "2 of 5 actions per chunk -> Flow-NFT (paired baseline) growing the executed part", task="so101-lift",
        steps=(collect, sft, _evaluate("before", "{sft}", "--execute-steps", "2"),
               _evaluate("before_long", "{sft}", "--execute-steps", "4"),
               _evaluate("before_full", "{sft}", "--execute-steps", "5"), trim, _evaluate("after", "{trim}")),
        figures=(Figure("before.success_rate", "SFT executing 2 of 5", ".3f"),
                 Figure("after.success_rate", "after", ".3f", per_seed=True),
                 Figure("after.execute_steps", "after: executed actions per chunk", ".0f", per_seed=True),
                 Figure("before_long.success_rate", "SFT executing 4 of 5", ".3f"),
                 Figure("before_full.success_rate", "SFT executing 5 of 5", ".3f"),
                 Figure("before.steps_to_success_mean", "SFT steps to first success", ".1f"),
                 Figure("after.steps_to_success_mean", "after: steps to first success", ".1f"),
                 Figure("trim.wall_s", "training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 320k env steps Flow-NFT; 128 evaluation episodes before / after",
        seeds=2, cost="~6 min per seed on one idle core", target="after: executed fraction up at equal success (within 0.03)",
        curve="trim.eval/success_rate", group="study", algos=("flow-nft",))


# PolicyTrim's step-efficiency reward: Flow-NFT in group mode (each group of 8 envs shares a start state and
# scores whole episodes) from the 10-demo SFT, scored by success plus a bonus for an early first success where the
# group reproduces it, against the same run scored by success alone (the control: what RL without the bonus does to
# the episode length). Before / after on the same 128 episodes.
def _policytrim_steps_lift() -> Entry:
    collect, sft = _demos_and_sft()
    group = ("--total-steps", "320000", "--eval-every", "16", "--eval-episodes", "64", *NFT_PAIRED_FLAGS,
             "--flow-nft.sampler", "noise", "--flow-nft.optimality", "group", "--flow-nft.rollout-chunks", "20")
    runs = tuple(_train("so101-lift", "flow-nft", "--init", "{sft}", *group, "--flow-nft.group-score", score, name=name)
                 for name, score in (("steps", "success-steps"), ("success", "success")))
    return Entry(
        name="policytrim-steps-so101-lift", title="PolicyTrim step-efficiency reward on so101-lift: Flow-NFT (group "
        "mode, paired baseline, noise sampler) from a 10-demo SFT scored by success + early-success bonus vs by success "
        "alone", task="so101-lift",
        steps=(collect, sft, _evaluate("before", "{sft}"), *runs, _evaluate("after_steps", "{steps}"),
               _evaluate("after_success", "{success}")),
        figures=(Figure("before.success_rate", "SFT", ".3f"),
                 Figure("after_steps.success_rate", "step bonus", ".3f", per_seed=True),
                 Figure("after_success.success_rate", "success only", ".3f", per_seed=True),
                 Figure("before.steps_to_success_mean", "SFT steps to first success", ".1f"),
                 Figure("after_steps.steps_to_success_mean", "step bonus: steps to first success", ".1f", per_seed=True),
                 Figure("after_success.steps_to_success_mean", "success only: steps to first success", ".1f",
                        per_seed=True),
                 Figure("steps.wall_s", "training s", ".0f")),
        budget="10 demos, 2,000 SFT updates, 320k env steps Flow-NFT per score; 128 evaluation episodes before / after",
        seeds=3, cost="~9 min per seed on one core",
        target="step bonus: fewer steps to first success at equal success (within 0.03)",
        curve="steps.eval/success_rate", group="study", algos=("flow-nft",))


ENTRIES = ENTRIES + (_flow_rl_lift(), _flow_nft_noise_lift(), _flow_rl_push(), _policytrim_lift(),
                     _policytrim_steps_lift())


def entry(name: str) -> Entry:
    for e in ENTRIES:
        if e.name == name:
            return e
    raise ValueError(f"no results entry {name!r}; registered: {', '.join(e.name for e in ENTRIES)}")
