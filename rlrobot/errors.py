"""Errors the CLI reports in one line (no traceback): what the user can fix outside the program."""


class MissingSystemDependency(RuntimeError):
    """A driver or device the simulator needs is not on this machine (e.g. ManiSkill's Vulkan); the message says what
    to install."""
