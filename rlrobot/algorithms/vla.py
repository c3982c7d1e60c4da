"""The VLA training algorithms: Flow-Noise / Flow-SDE PPO and flow-matching SFT on the ``vla`` policy kind, the same
learners and runners as the in-house flow policy (they only use the FlowPolicy protocol). The run's policy section is
``--vla.*`` (the checkpoint directory, LoRA, heads); the runners read it as ``run.flow`` through ``VLASection``.

    rlrobot train --algo vla-flow-noise --task so101-lift --control-mode joint_pos --obs-mode state+rgb \\
        --vla.path DIR [--vla.lora-rank 16]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlrobot.algorithms.flow_ppo import FlowPPOConfig
from rlrobot.algorithms.ppo import validate_ppo_common
from rlrobot.algorithms.registry import AlgorithmSpec, register_algorithm
from rlrobot.algorithms.sft import DatasetInput, SFTConfig
from rlrobot.checkpoints import load_config, load_section
from rlrobot.policies.registry import policy_kind_of
from rlrobot.policies.vla import config as vla_config
from rlrobot.policies.vla.config import VLAConfig
from rlrobot.policies.vla.portable import base_copy_source, is_base_copy


@dataclass
class VLAInit:
    init: str = ""
    """start from an rlrobot VLA run or checkpoint (e.g. a --algo vla-sft run); '' = the --vla.path weights"""


class VLASection:
    """Mixin of the VLA run configs: ``run.flow`` is the ``--vla`` section, so the flow runners and learners (which
    read ``run.flow.chunk_size`` / ``execute_steps`` / ``obs_keys``) drive a VLA unchanged."""

    @property
    def flow(self):
        return self.vla


# --vla settings that do not shape the weights: set on this run, they win over the --init run's (the noise bounds
# were silently taken from the SFT run before); any other field set on this run must agree with the --init run's
VLA_RUN_SETTINGS = ("execute_steps", "noise_std_min", "noise_std_max", "detach_critic", "gradient_checkpointing",
                    "bf16", "instruction")


def prepare_vla(run) -> None:
    """``--init`` (an rlrobot VLA run) adopts its ``--vla`` section, keeping ``VLA_RUN_SETTINGS`` given on this run and
    refusing other fields that differ from it; then the checkpoint fills and checks the rest."""
    if isinstance(run, VLAInit) and run.init and not run.resume:
        saved = load_config(run.init)
        kind = policy_kind_of(saved)
        if kind != "vla":
            raise ValueError(f"init={run.init!r} holds a {kind!r} policy; algo={run.algo!r} fine-tunes a 'vla' policy")
        init_vla, defaults = load_section(saved, "vla", VLAConfig), type(run.vla)()
        for name in vars(defaults):
            ours, theirs = getattr(run.vla, name), getattr(init_vla, name)
            if ours == getattr(defaults, name):
                continue
            if name in VLA_RUN_SETTINGS:
                setattr(init_vla, name, ours)
            elif name == "path" and Path(ours).expanduser().resolve() in (Path(theirs).expanduser().resolve(),
                                                                           base_copy_source(theirs)):
                continue
            elif ours != (tuple(theirs) if isinstance(ours, tuple) else theirs):
                raise ValueError(f"vla.{name}={ours!r} differs from the --init run's {theirs!r}: the weights and their "
                                 f"architecture come from --init (settings this run may change: {VLA_RUN_SETTINGS})")
        source = base_copy_source(init_vla.path)  # the --init run's copy of its base: the base itself while it exists
        if source is not None and source.is_dir():
            init_vla.path = str(source)
        run.vla = init_vla
    if run.vla.path and is_base_copy(run.vla.path) and not getattr(run, "init", "") and not run.resume:
        raise ValueError(f"vla.path={run.vla.path!r} is a run's copy of its base checkpoint, without weights (the run's "
                         "checkpoints hold them): pass that run as --init RUN")
    vla_config.resolve(run)


@dataclass
class VLAFlowPPOConfig(FlowPPOConfig):
    def validate(self, run) -> None:
        if not run.vla.path and not run.init:
            raise ValueError("vla.path is empty: pass --vla.path DIR (a LeRobot pretrained directory on local disk) or "
                             "--init RUN (an rlrobot VLA run)")
        validate_ppo_common(self, "flow_ppo")
        if self.overlap:
            raise ValueError("flow_ppo.overlap keeps a second copy of the policy for the rollouts: not offered for VLA "
                             "policies (billions of weights twice in memory)")
        if self.rollout_chunks < 1:
            raise ValueError(f"flow_ppo.rollout_chunks must be >= 1, got {self.rollout_chunks}")
        if self.noise_level <= 0:
            raise ValueError(f"flow_ppo.noise_level must be > 0, got {self.noise_level}")
        if self.dual_clip <= 1.0:
            raise ValueError(f"flow_ppo.dual_clip must be > 1, got {self.dual_clip}")
        if (run.num_envs * self.rollout_chunks) % self.num_minibatches:
            raise ValueError(f"num_envs x flow_ppo.rollout_chunks = {run.num_envs * self.rollout_chunks} must be "
                             f"divisible by flow_ppo.num_minibatches={self.num_minibatches}")

    def env_steps_per_iteration(self, run) -> int:
        execute = run.vla.execute_steps or run.vla.chunk_size
        if not execute:  # before prepare(): the checkpoint's chunk length (a bad path is reported by prepare)
            try:
                execute = vla_config.chunk_and_steps(vla_config.read_pretrained_config(run.vla.path))[0]
            except (ValueError, OSError, KeyError):
                execute = 1
        return run.num_envs * self.rollout_chunks * execute

    def prepare(self, run) -> None:
        prepare_vla(run)


@dataclass
class VLASFTConfig(SFTConfig):
    def validate(self, run) -> None:
        if not run.vla.path:
            raise ValueError("vla.path is empty: pass --vla.path DIR, a LeRobot pretrained directory on local disk")
        super().validate(run)

    def prepare(self, run) -> None:
        super().prepare(run)
        prepare_vla(run)


_RUNNERS = "rlrobot.runners.vla"
for _variant, _what in (("noise", "Flow-Noise PPO (pi_RL) of a LeRobot VLA (pi0 / pi0.5 / SmolVLA) from --vla.path"),
                        ("sde", "Flow-SDE PPO (pi_RL) of a LeRobot VLA (pi0 / pi0.5 / SmolVLA) from --vla.path")):
    register_algorithm(AlgorithmSpec(
        name=f"vla-flow-{_variant}", summary=_what, config_field="flow_ppo", config=VLAFlowPPOConfig, policy_kind="vla",
        runner=f"{_RUNNERS}:VLAFlowRunner", run_fields=(VLAInit, VLASection), flow_variant=_variant))
register_algorithm(AlgorithmSpec(
    name="vla-sft", summary="flow-matching SFT of a LeRobot VLA (pi0 / pi0.5 / SmolVLA) on a LeRobotDataset",
    config_field="sft", config=VLASFTConfig, policy_kind="vla", runner=f"{_RUNNERS}:VLASFTRunner",
    run_fields=(DatasetInput, VLASection)))

