"""Curricula: training-env wrappers and schedules that shape what a learner sees, for any algorithm that supports
them (Jump-Start RL's guide roll-ins; PolicyTrim's execute-length curriculum)."""
