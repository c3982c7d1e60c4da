"""The allowed values of every numeric config field, declared with its type so that one check covers them all.

A field is declared ``lr: Positive = 3e-4`` (``Annotated[float, Domain(...)]`` underneath, which tyro reads as a plain
float); ``check_domains(config)`` walks a config and its nested sections and refuses, in one line naming the field
and its allowed values, NaN, infinities and anything outside the declared domain, before any compute. Tuples of
numbers (``hidden: tuple[PositiveInt, ...]``) are checked element by element.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any


@dataclass(frozen=True)
class Domain:
    """An interval of allowed values; ``low`` / ``high`` of None are unbounded, ``*_open`` excludes the bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return not (self.high is not None and (value > self.high or (self.high_open and value == self.high)))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return "a finite number"


Finite = Annotated[float, Domain()]
"""any finite float"""
Positive = Annotated[float, Domain(low=0.0, low_open=True)]
NonNegative = Annotated[float, Domain(low=0.0)]
UnitInterval = Annotated[float, Domain(low=0.0, high=1.0)]
"""[0, 1]: probabilities, discounts, shares"""
OpenUnitInterval = Annotated[float, Domain(low=0.0, high=1.0, low_open=True, high_open=True)]
PositiveUnit = Annotated[float, Domain(low=0.0, high=1.0, low_open=True)]
"""(0, 1]: Polyak rates"""
PositiveInt = Annotated[int, Domain(low=1)]
"""counts of at least one"""
NonNegativeInt = Annotated[int, Domain(low=0)]
"""counts that may be 0 (0 usually meaning off, or 'all')"""
AnyInt = Annotated[int, Domain()]
"""integers without bounds (seeds)"""


def domain_of(annotation: Any) -> tuple[Domain | None, bool]:
    """(the Domain of an annotation, whether it applies to the elements of a tuple); (None, False) if undeclared."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, Domain):
                return meta, False
        return None, False
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                found = domain_of(arg)
                if found[0] is not None:
                    return found
        return None, False
    if origin is tuple:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        if args:
            domain, _ = domain_of(args[0])
            return domain, domain is not None
    return None, False


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def check_domains(config: Any, prefix: str = "") -> None:
    """Refuse the first numeric field of ``config`` (or of a nested section) outside its declared domain."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_domains(value, f"{name}.")
            continue
        domain, elementwise = domain_of(hints.get(f.name))
        if domain is None or value is None or isinstance(value, bool):
            continue
        values = value if elementwise else (value,)
        for v in values:
            if isinstance(v, int | float) and not domain.contains(v):
                raise ValueError(f"{name} must be {domain.describe()}, got {value!r}")


def numeric_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """Every int / float field (or tuple of them) of a config class and its nested sections: (dotted name, annotation).
    What the test that every numeric field declares its domain walks."""
    out = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        annotation = hints.get(f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            out += numeric_fields(type(default), f"{prefix}{f.name}.")
        elif _is_numeric(annotation):
            out.append((f"{prefix}{f.name}", annotation))
    return out


def _is_numeric(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_numeric(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_numeric(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is tuple:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return bool(args) and all(_is_numeric(a) for a in args)
    return annotation in (int, float)
