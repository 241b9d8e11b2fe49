"""msgpack decoding with explicit bounds on bytes, lengths, nesting and objects (specs/wire.md).

msgpack-python's ``unpackb`` bounds each string, binary, array and map by length, but not how many
objects a frame holds nor how deep they nest, and it builds every object before any hook could
object: 16 MiB of empty maps (one byte each) became 16 million dicts, over 1 GiB. So every frame is
first walked here, byte by byte, without building a Python object: each header is read, lengths
are checked against the bounds and against the bytes left, objects are counted and nesting is
tracked on a stack of at most ``max_depth`` integers. Only a frame that passes is handed to
``unpackb``, with the same length bounds set again. With the budgets used here no input of 16 MiB
costs more than about 100 MiB of Python objects (tests/test_bounded_decoding.py measures it).

``record_limits`` derives tighter bounds from a message schema, so each type's budget is what
its largest valid instance needs, never more than ``MAX_OBJECTS`` and ``MAX_DEPTH``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import msgpack

from intellect_node.protocol.errors import MalformedBody, Oversize
from intellect_node.protocol.schema import Bytes, Float, Int, ListOf, Nested, Optional, Record, Str, Validator

MAX_OBJECTS = 1 << 20  # about 100 MiB of Python objects at worst (one-entry maps of empty maps)
MAX_DEPTH = 32
SCHEMA_SLACK = 64  # room above a schema's own bounds, see record_limits
# What each header byte starts: (kind, argument). Kinds: a scalar of ``argument`` bytes in all,
# header included (ints, floats, nil, booleans); a string or binary whose length is in the header
# (fixstr) or in the next ``argument`` bytes; an array or map whose entry count is in the header or
# in the next ``argument`` bytes; a byte msgpack never uses; an extension type (this protocol has none).
_SCALAR, _FIXSTR, _STR, _BIN, _FIXARRAY, _FIXMAP, _ARRAY, _MAP, _UNUSED, _EXT = range(10)
_HEADS: list[tuple[int, int]] = (
    [(_SCALAR, 1)] * 0x80 + [(_FIXMAP, 0)] * 0x10 + [(_FIXARRAY, 0)] * 0x10 + [(_FIXSTR, 0)] * 0x20
    + [(_SCALAR, 1), (_UNUSED, 0), (_SCALAR, 1), (_SCALAR, 1), (_BIN, 1), (_BIN, 2), (_BIN, 4), (_EXT, 0),
       (_EXT, 0), (_EXT, 0), (_SCALAR, 5), (_SCALAR, 9), (_SCALAR, 2), (_SCALAR, 3), (_SCALAR, 5),
       (_SCALAR, 9), (_SCALAR, 2), (_SCALAR, 3), (_SCALAR, 5), (_SCALAR, 9), (_EXT, 0), (_EXT, 0),
       (_EXT, 0), (_EXT, 0), (_EXT, 0), (_STR, 1), (_STR, 2), (_STR, 4), (_ARRAY, 2), (_ARRAY, 4),
       (_MAP, 2), (_MAP, 4)]
    + [(_SCALAR, 1)] * 0x20
)
assert len(_HEADS) == 256


@dataclass(frozen=True)
class Limits:
    """What one frame may hold. Lengths are msgpack's: bytes of a string (UTF-8), entries of a map.

    ``max_depth`` counts containers: ``[]`` is depth 1, ``{"a": []}`` depth 2; scalars add none."""

    max_bytes: int
    max_str_len: int
    max_bin_len: int
    max_array_len: int
    max_map_len: int
    max_objects: int = MAX_OBJECTS
    max_depth: int = MAX_DEPTH


@functools.cache
def record_limits(record: type[Record], max_bytes: int) -> Limits:
    """The bounds for a ``record`` frame of at most ``max_bytes``, from its schema: the most objects
    a valid one can hold plus ``SCHEMA_SLACK`` (never more than ``MAX_OBJECTS``, nor one per byte),
    its nesting depth plus one, and each length the schema's longest with room (``_roomy``). The
    room leaves a value of the wrong type, a map with a field too many or a string a character too
    long to the schema to name (``wrong_type``, ``extra_field``, ``invalid_value``: a newer peer's
    extra field must not cost ``oversize``); the scan only stops what would cost memory."""
    shape = _shape(Nested(record))
    return Limits(max_bytes=max_bytes, max_str_len=min(_roomy(shape.str_len), max_bytes),
                  max_bin_len=min(_roomy(shape.bin_len), max_bytes),
                  max_array_len=min(_roomy(shape.array_len), max_bytes),
                  max_map_len=min(_roomy(shape.map_len), max_bytes),
                  max_objects=min(shape.objects + SCHEMA_SLACK, MAX_OBJECTS, max_bytes),
                  max_depth=min(shape.depth + 1, MAX_DEPTH))


def _roomy(length: int) -> int:
    return 2 * length + SCHEMA_SLACK


def unpack(data: bytes, limits: Limits, what: str) -> Any:
    """One msgpack value of ``data`` within ``limits``; ``Oversize`` naming the bound a frame
    exceeds, ``MalformedBody`` for anything that is not exactly one msgpack value. ``what`` names
    the frame in the message (e.g. "rollout_batch body")."""
    scan(data, limits, what)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                               max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
                               max_array_len=limits.max_array_len, max_map_len=limits.max_map_len, max_ext_len=0)
    except (ValueError, TypeError) as exc:  # msgpack's errors (ExtraData, FormatError, ...) are ValueErrors
        raise MalformedBody(f"{what} is not one msgpack value: {exc}"[:300]) from None


def scan(data: bytes, limits: Limits, what: str) -> None:
    """Check ``data`` against ``limits`` without building a Python object; raises as ``unpack``.

    Iterative: ``stack`` holds, for each open container, how many objects its parent still expects
    after it; ``need`` is how many the innermost open container still expects."""
    size = len(data)
    if size > limits.max_bytes:
        raise Oversize(f"{what}: {size} bytes, over max_bytes {limits.max_bytes}")
    pos, objects, need = 0, 0, 1
    stack: list[int] = []
    max_objects, max_depth = limits.max_objects, limits.max_depth
    heads = _HEADS
    while True:
        if pos >= size:
            raise MalformedBody(f"{what}: ends inside a value ({objects} objects read)")
        head = data[pos]
        objects += 1
        if objects > max_objects:
            raise Oversize(f"{what}: more than max_objects {max_objects} objects")
        if head < 0x80:  # positive fixint, the most common object: no table lookup
            kind, width = _SCALAR, 1
        else:
            kind, width = heads[head]
        if kind == _SCALAR:
            pos += width
            if pos > size:
                raise MalformedBody(f"{what}: ends inside a number")
        elif kind <= _BIN:
            if kind == _FIXSTR:
                length, pos = head & 0x1F, pos + 1
            else:
                length, pos = _length(data, pos, width, what), pos + 1 + width
            bound, name = (limits.max_bin_len, "max_bin_len") if kind == _BIN else (limits.max_str_len, "max_str_len")
            if length > bound:
                raise Oversize(f"{what}: a value of {length} bytes, over {name} {bound}")
            pos += length
            if pos > size:
                raise MalformedBody(f"{what}: a value of {length} bytes runs {pos - size} bytes past the end")
        elif kind <= _MAP:
            if kind <= _FIXMAP:
                count, pos = head & 0x0F, pos + 1
            else:
                count, pos = _length(data, pos, width, what), pos + 1 + width
            is_map = kind in (_FIXMAP, _MAP)
            if len(stack) >= max_depth:
                raise Oversize(f"{what}: nested deeper than max_depth {max_depth}")
            bound = limits.max_map_len if is_map else limits.max_array_len
            if count > bound:
                raise Oversize(f"{what}: {'map' if is_map else 'array'} of {count} entries, "
                               f"over {'max_map_len' if is_map else 'max_array_len'} {bound}")
            if count:
                children = 2 * count if is_map else count
                if children > size - pos:  # each object takes at least one byte
                    raise MalformedBody(f"{what}: a container announces {children} objects, {size - pos} bytes remain")
                stack.append(need - 1)
                need = children
                continue
        elif kind == _UNUSED:
            raise MalformedBody(f"{what}: byte 0xc1 at offset {pos} is never used by msgpack")
        else:
            raise MalformedBody(f"{what}: extension type (0x{head:02x}) at offset {pos}; this protocol uses none")
        need -= 1
        while need == 0 and stack:
            need = stack.pop()
        if need == 0:
            break
    if pos != size:
        raise MalformedBody(f"{what}: {size - pos} bytes after the value")


def _length(data: bytes, pos: int, width: int, what: str) -> int:
    """The big-endian length field of ``width`` bytes after the header byte at ``pos``."""
    if pos + 1 + width > len(data):
        raise MalformedBody(f"{what}: ends inside a length field")
    return int.from_bytes(data[pos + 1:pos + 1 + width], "big")


@dataclass(frozen=True)
class _Shape:
    """The most a schema value can hold: objects, container depth, and each kind's longest length."""

    objects: int = 1
    depth: int = 0
    str_len: int = 0
    bin_len: int = 0
    array_len: int = 0
    map_len: int = 0


# Bounds for a validator ``_shape`` does not know: no tighter than the global ones.
_UNKNOWN = _Shape(objects=MAX_OBJECTS, depth=MAX_DEPTH, str_len=1 << 62, bin_len=1 << 62, array_len=1 << 62,
                  map_len=1 << 62)


def _widest(shapes: list[_Shape]) -> _Shape:
    return _Shape(objects=0, depth=max((s.depth for s in shapes), default=0),
                  str_len=max((s.str_len for s in shapes), default=0),
                  bin_len=max((s.bin_len for s in shapes), default=0),
                  array_len=max((s.array_len for s in shapes), default=0),
                  map_len=max((s.map_len for s in shapes), default=0))


@functools.cache
def _shape(validator: Validator) -> _Shape:
    if isinstance(validator, Optional):
        return _shape(validator.inner)
    if isinstance(validator, Str):
        return _Shape(str_len=4 * validator.max_len)  # characters -> UTF-8 bytes
    if isinstance(validator, Bytes):
        return _Shape(bin_len=validator.max_len)
    if isinstance(validator, ListOf):
        item = _shape(validator.item)
        return _Shape(objects=1 + validator.max_items * item.objects, depth=1 + item.depth, str_len=item.str_len,
                      bin_len=item.bin_len, array_len=max(validator.max_items, item.array_len), map_len=item.map_len)
    if isinstance(validator, Nested):
        fields = validator.record.wire_fields()
        values = [_shape(inner) for _, inner in fields]
        keys = [_Shape(str_len=len(name.encode())) for name, _ in fields]
        wide = _widest(values + keys)
        return _Shape(objects=1 + sum(1 + value.objects for value in values), depth=1 + wide.depth,
                      str_len=wide.str_len, bin_len=wide.bin_len, array_len=wide.array_len,
                      map_len=max(len(fields), wide.map_len))
    if isinstance(validator, Int | Float):
        return _Shape()
    return _UNKNOWN  # a validator this module does not know: the global budgets, never none
