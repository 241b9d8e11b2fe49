"""The DiLoCo run's allowlist from its signed spec (specs/run_spec.md, ``diloco_run_spec``).

Why a signed spec rather than each node's ``[diloco] allowlist``: the allowlist decides who may
put values into every member's average, so it is the run owner's word, and one file signed by the
owner's key (``[diloco] authority``) is the same list on every node that checks it. A node reads
it before it starts (``[diloco] run_spec``); a file that does not decode, whose signature fails,
that has expired, or that another key signed or that names another run is a configuration error
naming the file and what was wrong. ``intellect-node diloco-spec`` writes one.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from intellect_node.crypto.identity import Identity
from intellect_node.node.diloco.settings import DilocoSettings
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.run_spec import DilocoRunSpec, read_signed_spec, sign_spec


class RunSpecError(ValueError):
    """The run spec named in ``[diloco] run_spec`` cannot be used; the message says why."""


def sign_run_spec(identity: Identity, run_id: str, allowlist: tuple[str, ...], lifetime_s: float) -> bytes:
    """The owner's signed envelope admitting ``allowlist`` to ``run_id``'s rounds; ``Rejected``
    (naming the field) for one that its nodes would refuse, such as a string that is no peer id."""
    spec = DilocoRunSpec(run_id=run_id, authority=identity.peer_id, allowlist=tuple(dict.fromkeys(allowlist)))
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
    """``settings`` with the allowlist of the signed spec it names (unchanged without one); a
    relative ``run_spec`` is read from ``base_dir`` (the config file's directory)."""
    if not settings.run_spec:
        return settings
    if settings.allowlist:
        raise RunSpecError("[diloco] allowlist and run_spec both set: the signed spec's allowlist is the run's; "
                           "drop allowlist")
    spec = read_run_spec(base_dir / settings.run_spec, authority=settings.authority, run_id=run_id)
    return dataclasses.replace(settings, allowlist=spec.allowlist)
