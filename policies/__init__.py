"""Policies, each a registered kind (``registry.py``): the MLP Gaussian actor-critic (PPO), the SAC actor with its
critic ensemble, and the flow-matching action-chunk policy (``FlowPolicy`` protocol; LeRobot VLA adapters implement
the same protocol in ``vla/``)."""

from . import actor_critic, flow, sac_policy  # noqa: F401  (register the built-in kinds)
from .actor_critic import ActorCritic, ActorCriticConfig
from .flow import FlowPolicy, FlowPolicyConfig, MLPFlowPolicy
from .normalizer import RunningNormalizer
from .registry import PolicySpec, build_policy, check_compatible, policy_kinds, policy_metadata, register_policy
from .sac_policy import SACPolicy, SACPolicyConfig

__all__ = ["ActorCritic", "ActorCriticConfig", "FlowPolicy", "FlowPolicyConfig", "MLPFlowPolicy", "PolicySpec",
           "RunningNormalizer", "SACPolicy", "SACPolicyConfig", "build_policy", "check_compatible", "policy_kinds",
           "policy_metadata", "register_policy"]
