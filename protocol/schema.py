"""Strict schemas for message bodies: exact key sets, exact types, bounded sizes.

A message type is a frozen dataclass deriving from ``Record`` whose fields carry a validator through
``wire(...)``. Decoding refuses missing and extra keys, values of the wrong msgpack type (a bool is
not an int, an int is not a float), out-of-range numbers and over-long strings and lists, each with
its own ``Rejected`` subclass. Encoding is the mirror image, so a round trip is the identity.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from intellect_node.protocol.errors import (
    ExtraField,
    InvalidValue,
    MissingField,
    WrongType,
)

T = TypeVar("T", bound="Record")


class Validator(Protocol):
    def decode(self, value: Any, path: str) -> Any: ...

    def encode(self, value: Any) -> Any: ...


def _type_name(value: Any) -> str:
    return type(value).__name__


@dataclass(frozen=True)
class Int:
    low: int = 0
    high: int = 2**63 - 1

    def decode(self, value: Any, path: str) -> int:
        if type(value) is not int:
            raise WrongType(f"{path}: expected int, got {_type_name(value)}")
        if not self.low <= value <= self.high:
            raise InvalidValue(f"{path}: {value} outside [{self.low}, {self.high}]")
        return value

    def encode(self, value: int) -> int:
        return value


@dataclass(frozen=True)
class Float:
    low: float = 0.0
    high: float = 1e18

    def decode(self, value: Any, path: str) -> float:
        if type(value) is not float:
            raise WrongType(f"{path}: expected float, got {_type_name(value)}")
        if math.isnan(value) or not self.low <= value <= self.high:
            raise InvalidValue(f"{path}: {value} outside [{self.low}, {self.high}]")
        return value

    def encode(self, value: float) -> float:
        return float(value)


@dataclass(frozen=True)
class Str:
    max_len: int
    pattern: str | None = None
    choices: frozenset[str] | None = None

    def decode(self, value: Any, path: str) -> str:
        if type(value) is not str:
            raise WrongType(f"{path}: expected str, got {_type_name(value)}")
        if len(value) > self.max_len:
            raise InvalidValue(f"{path}: {len(value)} characters, at most {self.max_len}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise InvalidValue(f"{path}: {value[:40]!r} does not match {self.pattern}")
        if self.choices is not None and value not in self.choices:
            raise InvalidValue(f"{path}: {value[:40]!r} not one of {sorted(self.choices)}")
        return value

    def encode(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class Bytes:
    max_len: int
    min_len: int = 0

    def decode(self, value: Any, path: str) -> bytes:
        if type(value) is not bytes:
            raise WrongType(f"{path}: expected bytes, got {_type_name(value)}")
        if not self.min_len <= len(value) <= self.max_len:
            raise InvalidValue(f"{path}: {len(value)} bytes outside [{self.min_len}, {self.max_len}]")
        return value

    def encode(self, value: bytes) -> bytes:
        return value


@dataclass(frozen=True)
class Optional:
    inner: Validator

    def decode(self, value: Any, path: str) -> Any:
        return None if value is None else self.inner.decode(value, path)

    def encode(self, value: Any) -> Any:
        return None if value is None else self.inner.encode(value)


@dataclass(frozen=True)
class ListOf:
    item: Validator
    max_items: int
    unique: bool = False

    def decode(self, value: Any, path: str) -> tuple[Any, ...]:
        if type(value) is not list:
            raise WrongType(f"{path}: expected list, got {_type_name(value)}")
        if len(value) > self.max_items:
            raise InvalidValue(f"{path}: {len(value)} items, at most {self.max_items}")
        items = tuple(self.item.decode(item, f"{path}[{i}]") for i, item in enumerate(value))
        if self.unique and len(set(items)) != len(items):
            raise InvalidValue(f"{path}: duplicate items")
        return items

    def encode(self, value: tuple[Any, ...]) -> list[Any]:
        return [self.item.encode(item) for item in value]


@dataclass(frozen=True)
class Nested:
    record: type[Record]

    def decode(self, value: Any, path: str) -> Record:
        return self.record.from_wire(value, path)

    def encode(self, value: Record) -> dict[str, Any]:
        return value.to_wire()


def wire(validator: Validator, **kwargs: Any) -> Any:
    """Declare a record field together with the validator that checks it on the way in."""
    return dataclasses.field(metadata={"wire": validator}, **kwargs)


@dataclass(frozen=True)
class Record:
    """A dataclass that decodes itself strictly from, and encodes itself to, a msgpack map."""

    _fields_cache: ClassVar[dict[type, tuple[tuple[str, Validator], ...]]] = {}

    @classmethod
    def wire_fields(cls) -> tuple[tuple[str, Validator], ...]:
        cached = Record._fields_cache.get(cls)
        if cached is None:
            cached = tuple((f.name, f.metadata["wire"]) for f in dataclasses.fields(cls))
            Record._fields_cache[cls] = cached
        return cached

    @classmethod
    def from_wire(cls: type[T], value: Any, path: str = "body") -> T:
        if type(value) is not dict:
            raise WrongType(f"{path}: expected map, got {_type_name(value)}")
        fields = cls.wire_fields()
        names = {name for name, _ in fields}
        extra = [key for key in value if key not in names]
        if extra:
            raise ExtraField(f"{path}: unexpected field {str(extra[0])[:40]!r}")
        missing = [name for name in names if name not in value]
        if missing:
            raise MissingField(f"{path}: missing field {missing[0]!r}")
        record = cls(**{name: validator.decode(value[name], f"{path}.{name}") for name, validator in fields})
        record.check(path)
        return record

    def check(self, path: str) -> None:
        """Rules that relate fields to one another; raise ``InvalidValue``. Fields are checked already."""

    def to_wire(self) -> dict[str, Any]:
        return {name: validator.encode(getattr(self, name)) for name, validator in self.wire_fields()}
