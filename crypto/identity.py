"""The node's Ed25519 identity and the libp2p peer ID derived from it.

One key does both jobs: it signs every message the node sends, and (through the same 32-byte seed)
it is the libp2p host key. So a signature and a connection always name the same peer, and a
validator that sees a signed rollout knows which connection it came from.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

KEY_FILE_NAME = "identity.key"
_KEY_FILE_MAGIC = b"intellect-node ed25519 v1\n"
_MAX_KEY_FILE_BYTES = 4096  # the magic and 64 hex digits, with room for stray whitespace
PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64

# libp2p's PublicKey protobuf for an Ed25519 key is: field 1 (KeyType) varint 1, field 2 (Data)
# length-delimited 32 bytes. It is 36 bytes, short enough to inline as an identity multihash.
_LIBP2P_ED25519_PUBKEY_PREFIX = bytes([0x08, 0x01, 0x12, PUBLIC_KEY_SIZE])
_IDENTITY_MULTIHASH_PREFIX = bytes([0x00, len(_LIBP2P_ED25519_PUBKEY_PREFIX) + PUBLIC_KEY_SIZE])


class IdentityError(Exception):
    """A key file that cannot be used; the message tells the operator what to do."""


def peer_id_from_public_key(public_key: bytes) -> str:
    """The base58 libp2p peer ID ("12D3KooW...") of a raw 32-byte Ed25519 public key."""
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key has {PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    return base58.b58encode(_IDENTITY_MULTIHASH_PREFIX + _LIBP2P_ED25519_PUBKEY_PREFIX + public_key).decode()


def public_key_from_peer_id(peer_id: str) -> bytes:
    """The raw Ed25519 public key inlined in a peer ID; ValueError if the ID holds none."""
    try:
        raw = base58.b58decode(peer_id.encode("ascii"))
    except (ValueError, UnicodeEncodeError) as exc:
        raise ValueError("peer id is not base58") from exc
    prefix = _IDENTITY_MULTIHASH_PREFIX + _LIBP2P_ED25519_PUBKEY_PREFIX
    if len(raw) != len(prefix) + PUBLIC_KEY_SIZE or not raw.startswith(prefix):
        raise ValueError("peer id does not inline an Ed25519 public key")
    return raw[len(prefix) :]


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``."""
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """An Ed25519 signing key with its public key and libp2p peer ID."""

    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @property
    def seed(self) -> bytes:
        """The 32-byte private seed; the libp2p host key is built from the same bytes."""
        return self.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    @property
    def public_key(self) -> bytes:
        return self.private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


def save_identity(identity: Identity, path: Path) -> None:
    """Write the key file with mode 0600 from the first byte on (never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(_KEY_FILE_MAGIC + identity.seed.hex().encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_identity(path: Path) -> Identity:
    """Load a key file, refusing one that other users can read or that is malformed."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise IdentityError(f"no key file at {path}; create one with `intellect-node keygen`") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise IdentityError(
            f"key file {path} is accessible by other users (mode {stat.S_IMODE(mode):o}); "
            f"fix it with `chmod 600 {path}`"
        )
    try:  # bounded: the file is the user's, and a key file is one short line
        with path.open("rb") as handle:
            data = handle.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise IdentityError(f"cannot read key file {path}: {exc}") from None
    if len(data) > _MAX_KEY_FILE_BYTES or not data.startswith(_KEY_FILE_MAGIC):
        raise IdentityError(f"{path} is not an intellect-node key file")
    try:
        seed = bytes.fromhex(data[len(_KEY_FILE_MAGIC) :].strip().decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        raise IdentityError(f"{path} is corrupt: the key is not hex") from None
    if len(seed) != 32:
        raise IdentityError(f"{path} is corrupt: the key has {len(seed)} bytes, expected 32")
    return Identity.from_seed(seed)


def load_or_create_identity(path: Path) -> tuple[Identity, bool]:
    """The identity at ``path``, created on first use; the flag says whether it was created."""
    if path.exists():
        return load_identity(path), False
    identity = Identity.generate()
    save_identity(identity, path)
    return identity, True
