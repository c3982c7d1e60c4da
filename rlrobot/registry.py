"""One registry shape for every kind of plug-in (algorithms, policy kinds, tasks, reward kinds): a module registers
its spec on import; look-ups refuse an unknown name with the registered ones (and the closest, for typos)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

Spec = TypeVar("Spec")


class Registry(Generic[Spec]):
    """Specs by name. ``load_builtin`` imports the modules that register the built-in ones (once, on first look-up)."""

    def __init__(self, what: str, name_of: Callable[[Spec], str], load_builtin: Callable[[], None] | None = None):
        self.what, self.name_of, self._load_builtin = what, name_of, load_builtin
        self._specs: dict[str, Spec] = {}
        self._loaded = load_builtin is None

    def register(self, spec: Spec) -> Spec:
        name = self.name_of(spec)
        if name in self._specs and self._specs[name] != spec:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._specs[name] = spec
        return spec

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            self._load_builtin()

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(sorted(self._specs))

    def specs(self) -> tuple[Spec, ...]:
        return tuple(self._specs[name] for name in self.names())

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._specs

    def get(self, name: str, field: str | None = None) -> Spec:
        """The spec registered as ``name``; otherwise a one-line error naming ``field`` (default: the kind of plug-in)
        and the registered names."""
        self._load()
        if name not in self._specs:
            close = difflib.get_close_matches(name, self._specs, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{field or self.what}={name!r} is not a registered {self.what}; {hint}registered: "
                             f"{', '.join(sorted(self._specs))}")
        return self._specs[name]
