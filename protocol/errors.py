"""Every way a network input can be refused, one class each, with a stable ``reason`` label.

The node counts rejections by ``reason`` and penalizes the sender, so the labels are part of the
operator-facing interface (metrics, logs, specs/wire.md): never rename one.
"""

from __future__ import annotations

from intellect_node.crypto.envelope import (
    BadLifetime,
    BadSignature,
    Expired,
    FromTheFuture,
    MalformedEnvelope,
    Rejected,
    UnknownMessageType,
)

__all__ = [
    "BadLifetime",
    "BadSignature",
    "Expired",
    "ExtraField",
    "FromTheFuture",
    "InvalidValue",
    "MalformedBody",
    "MalformedEnvelope",
    "MalformedReply",
    "MissingField",
    "Oversize",
    "Rejected",
    "Replayed",
    "SignerMismatch",
    "Stalled",
    "Truncated",
    "UnknownMessageType",
    "Unjudgeable",
    "UnsupportedVersion",
    "NewerVersion",
    "WrongType",
]


class Oversize(Rejected):
    reason = "oversize"


class UnsupportedVersion(Rejected):
    """A protocol version that never existed or is no longer spoken."""

    reason = "unsupported_version"


class NewerVersion(UnsupportedVersion):
    """A newer protocol version than this node speaks: an upgraded honest peer, never evidence."""

    reason = "newer_version"


class MalformedReply(Rejected):
    """Bytes that are not the protocol message expected at this place (e.g. a DHT reply)."""

    reason = "malformed"


class MalformedBody(Rejected):
    reason = "malformed_body"


class MissingField(Rejected):
    reason = "missing_field"


class ExtraField(Rejected):
    reason = "extra_field"


class WrongType(Rejected):
    reason = "wrong_type"


class InvalidValue(Rejected):
    reason = "invalid_value"


class SignerMismatch(Rejected):
    reason = "signer_mismatch"


class Replayed(Rejected):
    reason = "replayed"


class Truncated(Rejected):
    reason = "truncated"


class Unanswered(Truncated):
    """Closed before its first byte: no answer rather than a bad one. A busy or restarting honest
    peer, or one that banned us, does this too, so it costs little (specs/wire.md section 5); a
    stream or answer cut after its first byte is ``truncated``."""

    reason = "unanswered"


class Unjudgeable(Rejected):
    """A message this node has no way to judge (a checkpoint manifest when it knows no trainer):
    dropped unforwarded and counted, never charged. The forwarder did not write it, and nothing
    about it is proven wrong; an honest node that knows the trainer forwards it rightly."""

    reason = "unjudgeable"


class Stalled(Rejected):
    reason = "timeout"
