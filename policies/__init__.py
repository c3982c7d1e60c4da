"""Policies: MLP actor-critics (more to come: flow-matching action-chunk policy, LeRobot VLA adapters)."""

from .actor_critic import ActorCritic, ActorCriticConfig
from .normalizer import RunningNormalizer

__all__ = ["ActorCritic", "ActorCriticConfig", "RunningNormalizer"]
