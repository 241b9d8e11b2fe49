"""The DiLoCo run's allowlist and compression from its signed spec (specs/run_spec.md,
``diloco_run_spec``).

Why a signed spec rather than each node's ``[diloco] allowlist`` and ``compression``: the
allowlist decides who may put values into every member's average, and the compression which grid
they average on (members on different grids never share a round, so a node on another one would
train alone without knowing why); both are the run owner's word, and one file signed by the owner's
key (``[diloco] authority``) is the same word on every node that checks it. A node reads it before
it starts (``[diloco] run_spec``); a file that does not decode, whose signature fails, that has
expired, that another key signed or that names another run, or whose compression contradicts the
node's own ``[diloco]`` section, is a configuration error naming the file and what was wrong.
``intellect-node diloco-spec`` writes one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from intellect_node.crypto.identity import Identity
from intellect_node.node.config.base import ConfigError
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.run_spec import DILOCO_DEFAULT_COMPRESSION, DilocoRunSpec, read_signed_spec, sign_spec


class RunSpecError(ValueError):
    """The run spec named in ``[diloco] run_spec`` cannot be used; the message says why."""


def sign_run_spec(identity: Identity, run_id: str, allowlist: tuple[str, ...], lifetime_s: float, *,
                  compression: str = DILOCO_DEFAULT_COMPRESSION) -> bytes:
    """The owner's signed envelope admitting ``allowlist`` to ``run_id``'s rounds on the grid
    ``compression`` names; ``Rejected`` (naming the field) for one that its nodes would refuse, such
    as a string that is no peer id or a compression that is none of the protocol's."""
    spec = DilocoRunSpec(run_id=run_id, authority=identity.peer_id, allowlist=tuple(dict.fromkeys(allowlist)),
                         compression=compression)
    return sign_spec(spec, identity, lifetime_s)


def read_run_spec(path: Path, *, authority: str, run_id: str) -> DilocoRunSpec:
    """The spec at ``path`` if ``authority`` signed it for ``run_id``, else ``RunSpecError``."""
    try:
        spec, _ = read_signed_spec(path, DilocoRunSpec, authority=authority, run_id=run_id)
        return spec
    except OSError as exc:
        raise RunSpecError(f"[diloco] run_spec {path}: cannot read it: {exc.strerror or exc}") from None
    except Rejected as exc:
        raise RunSpecError(f"[diloco] run_spec {path} refused ({exc.reason}): {exc}") from None


def with_run_spec(settings: DilocoSettings, run_id: str, base_dir: Path) -> DilocoSettings:
    """``settings`` with the allowlist and the compression of the signed spec it names (unchanged
    without one); a relative ``run_spec`` is read from ``base_dir`` (the config file's directory).
    The spec's compression goes through the settings' own checks (a sparse one needs
    ``error_feedback``), refused as the spec's when it fails them."""
    if not settings.run_spec:
        return settings
    if settings.allowlist:
        raise RunSpecError("[diloco] allowlist and run_spec both set: the signed spec's allowlist is the run's; "
                           "drop allowlist")
    path = base_dir / settings.run_spec
    spec = read_run_spec(path, authority=settings.authority, run_id=run_id)
    _check_compression(settings, spec, path)
    try:
        return dataclasses.replace(settings, allowlist=spec.allowlist, compression=spec.compression)
    except ConfigError as exc:
        raise RunSpecError(f"[diloco] run_spec {path} sets compression = {spec.compression!r}, "
                           f"which this node's [diloco] section refuses: {exc}") from None


def _check_compression(settings: DilocoSettings, spec: DilocoRunSpec, path: Path) -> None:
    """Refuse a node whose own ``[diloco] compression`` contradicts the spec's: taking the spec's
    silently would override what its operator chose. One left at the default takes the spec's (the
    default cannot be told apart from a node that set it to that value)."""
    if settings.compression not in (DILOCO_DEFAULT_COMPRESSION, spec.compression):
        raise RunSpecError(f"[diloco] compression = {settings.compression!r}, but run_spec {path} (the owner's signed "
                           f"word) says {spec.compression!r}: drop compression, or set it to {spec.compression!r}")
