import os
import stat

import pytest
from libp2p.crypto.ed25519 import Ed25519PrivateKey as Libp2pEd25519
from libp2p.peer.id import ID

from intellect_node.crypto.identity import (
    Identity,
    IdentityError,
    load_identity,
    load_or_create_identity,
    peer_id_from_public_key,
    public_key_from_peer_id,
    save_identity,
    verify_signature,
)


def test_peer_id_equals_libp2p_derivation_from_same_seed():
    identity = Identity.generate()
    libp2p_key = Libp2pEd25519.new(identity.seed)
    assert ID.from_pubkey(libp2p_key.get_public_key()).to_base58() == identity.peer_id
    assert public_key_from_peer_id(identity.peer_id) == identity.public_key


def test_key_file_is_created_0600_and_reloads_same_identity(tmp_path):
    path = tmp_path / "home" / "identity.key"
    first, created = load_or_create_identity(path)
    assert created
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created_again = load_or_create_identity(path)
    assert not created_again
    assert again.peer_id == first.peer_id


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_key_file_readable_by_others_is_refused_with_a_fix(tmp_path, mode):
    path = tmp_path / "identity.key"
    save_identity(Identity.generate(), path)
    os.chmod(path, mode)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(path)


@pytest.mark.parametrize("content", [b"", b"not a key", b"intellect-node ed25519 v1\nzz\n",
                                     b"intellect-node ed25519 v1\n" + b"ab" * 31 + b"\n"])
def test_corrupt_key_file_is_refused(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(IdentityError):
        load_identity(path)


def test_missing_key_file_says_how_to_create_one(tmp_path):
    with pytest.raises(IdentityError, match="keygen"):
        load_identity(tmp_path / "absent.key")


def test_signatures_verify_only_for_the_signer_and_message():
    alice, bob = Identity.generate(), Identity.generate()
    signature = alice.sign(b"hello")
    assert verify_signature(alice.public_key, signature, b"hello")
    assert not verify_signature(bob.public_key, signature, b"hello")
    assert not verify_signature(alice.public_key, signature, b"hellO")
    assert not verify_signature(alice.public_key, signature[:-1], b"hello")


@pytest.mark.parametrize("bad", ["", "0OIl", "12D3KooW", peer_id_from_public_key(bytes(32))[:-2]])
def test_public_key_from_malformed_peer_id_raises_value_error(bad):
    with pytest.raises(ValueError):
        public_key_from_peer_id(bad)


def test_unreadable_or_oversize_key_file_is_refused(tmp_path):
    directory = tmp_path / "dir.key"
    directory.mkdir(mode=0o700)
    with pytest.raises(IdentityError, match="cannot read key file"):
        load_identity(directory)
    huge = tmp_path / "huge.key"
    save_identity(Identity.generate(), huge)
    with open(huge, "ab") as handle:  # a valid key followed by a sparse gigabyte: refused, not read
        handle.truncate(1 << 30)
    with pytest.raises(IdentityError, match="not an intellect-node key file"):
        load_identity(huge)
