"""Checkpoints on disk: one directory per step, partial until every shard is verified.

    <data_dir>/<run_id>/<step:012d>.partial/   manifest.ine, checkpoint.safetensors, verified
    <data_dir>/<run_id>/<step:012d>/           manifest.ine, checkpoint.safetensors[, delta.bin]

``delta.bin`` is the step's delta body (specs/deltas.md), kept where this node published or applied
it, so that it can serve it to the nodes that follow by deltas.

Directory names come only from the configured run id (checked against the run-id pattern) and an
integer step, never from a peer's string, so nothing can be written outside the data directory.
A partial file may hold unverified bytes in shards not yet marked; the ``verified`` list (one byte
per shard, replaced atomically) says which ranges may be served. Completion is one directory
rename, with an ``unsynced`` marker inside until the step's files are fsynced in the background (a
follower's delta step waited ~0.3 s for that on a 269 MB policy, more for larger models); a step
built from a delta and a step published here write their manifest and delta body without an
fsync of their own, and that sync covers them. A restart hashes a marked directory again (and
drops a kept delta body that is not the signed one) before it trusts it, so a half checkpoint
never looks complete, even after kill -9 or power loss. On restart every shard marked verified
is hashed again before it is trusted (a resume never re-downloads a good shard and never keeps a
torn one).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import trio

from intellect_node.node.home.durable import fsync_directory, fsync_file, write_durably
from intellect_node.node.shards.checkpoint import hash_range
from intellect_node.protocol.codec import Signed, decode
from intellect_node.protocol.deltas import delta_hash
from intellect_node.protocol.errors import Rejected
from intellect_node.protocol.manifest import CheckpointManifest
from intellect_node.protocol.messages import RUN_ID_PATTERN

log = logging.getLogger(__name__)
PARTIAL = ".partial"
MANIFEST_FILE = "manifest.ine"
DATA_FILE = "checkpoint.safetensors"
VERIFIED_FILE = "verified"
DELTA_FILE = "delta.bin"
UNSYNCED_FILE = "unsynced"  # in a complete directory: its data file's fsync has not finished
_STEP_DIR_SYNCER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shards-fsync")  # one per process
_STEP_DIR = re.compile(r"(\d{12})(\.partial)?")


class InsufficientDisk(Exception):
    """The checkpoint does not fit in the free space of the data directory."""


@dataclass
class Checkpoint:
    """One step held (fully or partly) by this node, with what the server and fetcher share."""

    manifest: CheckpointManifest
    envelope: bytes
    directory: Path
    verified: bytearray  # one byte per shard: 1 once its hash matched
    origin: bool = False  # published by this node: its server hands out each shard once first
    uploads: list[int] = field(default_factory=list)  # per shard: uploads started (seed mode)
    uploading: list[int] = field(default_factory=list)  # per shard: uploads in flight
    uploaded_at: list[float] = field(default_factory=list)  # per shard: when the last upload ended
    recipients: list[str] = field(default_factory=list)  # peers that received a whole shard from here, newest last
    version: int = 0
    changed: trio.Event = field(default_factory=trio.Event)
    completed_at: float | None = None  # wall time it became complete here (None: before a restart)
    on_copy_ahead: bool = False  # built from a delta on a base copied ahead of it (specs/deltas.md 5a)

    def __post_init__(self) -> None:
        self.uploads = [0] * self.manifest.shard_count
        self.uploading = [0] * self.manifest.shard_count
        self.uploaded_at = [0.0] * self.manifest.shard_count

    @property
    def step(self) -> int:
        return self.manifest.step

    @property
    def complete(self) -> bool:
        return not self.directory.name.endswith(PARTIAL)

    @property
    def data_path(self) -> Path:
        return self.directory / DATA_FILE

    @property
    def delta_path(self) -> Path:
        return self.directory / DELTA_FILE

    @property
    def verified_count(self) -> int:
        return sum(self.verified)

    def envelope_expiry_ms(self) -> int:
        """When the envelope held expires; 0 once it no longer decodes (expired), so any fresh copy wins."""
        try:
            return decode(self.envelope, CheckpointManifest).envelope.expiry_ms
        except Rejected:
            return 0

    def bump(self) -> None:
        """Wake everyone waiting on this checkpoint's state (have long-polls, schedulers)."""
        self.version += 1
        self.changed.set()
        self.changed = trio.Event()

    def range_verified(self, start: int, end: int) -> bool:
        """True when every shard that [start, end) touches is verified."""
        size = self.manifest.shard_size
        return end > start and all(self.verified[i] for i in range(start // size, (end - 1) // size + 1))


ManifestDecoder = Callable[[bytes], Signed[CheckpointManifest]]


class ShardStore:
    """The checkpoints of one run under ``data_dir/run_id``."""

    def __init__(self, data_dir: Path, run_id: str) -> None:
        if not re.fullmatch(RUN_ID_PATTERN, run_id):
            raise ValueError(f"run id {run_id!r} is not a valid run id")
        self.root = data_dir.resolve() / run_id
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.checkpoints: dict[int, Checkpoint] = {}

    def _dir(self, step: int, partial: bool) -> Path:
        if type(step) is not int or not 0 <= step < 10**12:
            raise ValueError(f"step {step!r} cannot name a directory")
        path = self.root / (f"{step:012d}" + (PARTIAL if partial else ""))
        assert path.parent == self.root  # the name above cannot contain a separator; belt and braces
        return path

    # ---- restart ---------------------------------------------------------------------------

    def reopen(self, decode: ManifestDecoder) -> list[int]:
        """Load what an earlier run left; returns, per partial step, the shards kept after re-hashing.

        A directory whose manifest no longer decodes (expired, another trainer) is deleted. The
        checkpoints held are replaced by what is read: the supervisor restarts a failed overlay on
        this same store, and a step still held from before is the directory being read, not a
        duplicate of it (taken for one, every held checkpoint was deleted under its readers).
        """
        found: dict[int, Checkpoint] = {}
        resumed: list[int] = []
        for path in sorted(self.root.iterdir()):
            match = _STEP_DIR.fullmatch(path.name)
            if match is None or not path.is_dir():
                self._remove(path)  # temp files of a publish that crashed, or junk
                continue
            try:
                envelope = (path / MANIFEST_FILE).read_bytes()
                signed = decode(envelope)
            except (OSError, Rejected) as exc:
                log.info("dropping %s: %s", path.name, exc)
                self._remove(path)
                continue
            manifest = signed.message
            if manifest.step != int(match.group(1)) or manifest.step in found:
                self._remove(path)
                continue
            partial = match.group(2) is not None
            if not partial and (path / UNSYNCED_FILE).exists():
                path, verified = self._recheck_unsynced(path, manifest)
                if path.name.endswith(PARTIAL):
                    resumed.append(sum(verified))
            elif partial:
                verified = self._recheck(path, manifest)
                resumed.append(sum(verified))
            else:
                verified = bytearray([1]) * manifest.shard_count
            found[manifest.step] = Checkpoint(manifest, envelope, path, verified)
        self.checkpoints = found
        return resumed

    def _recheck_unsynced(self, path: Path, manifest: CheckpointManifest) -> tuple[Path, bytearray]:
        """A complete directory whose fsync had not finished when the node stopped: every shard is
        hashed again. All right: it is synced now and stays complete. Else it turns partial with
        its good shards marked verified: the resume fetches only the rest."""
        verified = self._recheck(path, manifest, claimed=bytes([1]) * manifest.shard_count)
        _drop_torn_delta(path, manifest)
        if all(verified):
            self._make_durable(path)
            return path, verified
        log.warning("step %d was complete but not yet on disk when the node stopped, and %d of its %d shards "
                    "read wrong: resuming it", manifest.step, len(verified) - sum(verified), len(verified))
        partial = self._dir(manifest.step, partial=True)
        self._remove(partial)
        write_durably(path / VERIFIED_FILE, bytes(verified))
        (path / UNSYNCED_FILE).unlink()  # a partial directory has its verified file instead
        os.rename(path, partial)
        return partial, verified

    def _recheck(self, path: Path, manifest: CheckpointManifest, claimed: bytes | None = None) -> bytearray:
        """The shards ``claimed`` verified (by default: the ``verified`` file) whose bytes hash right."""
        if claimed is None:
            try:
                claimed = (path / VERIFIED_FILE).read_bytes()
            except OSError:
                claimed = b""
        verified = bytearray(manifest.shard_count)
        try:
            size = (path / DATA_FILE).stat().st_size
        except OSError:  # the data file never reached the disk
            return verified
        if len(claimed) != manifest.shard_count or size != manifest.total_size:
            return verified
        fd = os.open(path / DATA_FILE, os.O_RDONLY)
        try:
            for index, mark in enumerate(claimed):
                if mark == 1 and hash_range(fd, *manifest.shard_range(index)) == manifest.shard_hashes[index]:
                    verified[index] = 1
        finally:
            os.close(fd)
        return verified

    # ---- fetching --------------------------------------------------------------------------

    def begin(self, signed: Signed[CheckpointManifest], envelope: bytes, *, durable: bool = True) -> Checkpoint:
        """A new partial checkpoint: manifest written, data file allocated (sparse), nothing verified.
        ``durable=False`` for a step built at once (from a delta): its files are written without an
        fsync on the step's path, and ``finalize``'s background sync makes them durable."""
        manifest = signed.message
        free = shutil.disk_usage(self.root).free
        if manifest.total_size > free:
            raise InsufficientDisk(f"step {manifest.step} needs {manifest.total_size} bytes, {free} free")
        directory = self._dir(manifest.step, partial=True)
        self._remove(directory)
        directory.mkdir(mode=0o700)
        write = write_durably if durable else Path.write_bytes  # a pending sync covers the plain write
        write(directory / MANIFEST_FILE, envelope)
        with open(directory / DATA_FILE, "wb") as f:
            f.truncate(manifest.total_size)
        checkpoint = Checkpoint(manifest, envelope, directory, bytearray(manifest.shard_count))
        write(directory / VERIFIED_FILE, bytes(checkpoint.verified))
        self.checkpoints[manifest.step] = checkpoint
        return checkpoint

    def mark_verified(self, checkpoint: Checkpoint, index: int) -> None:
        """Record a verified shard in memory (served from now on); ``persist_verified`` saves it."""
        checkpoint.verified[index] = 1
        checkpoint.bump()

    def persist_verified(self, checkpoint: Checkpoint) -> None:
        """Save which shards are verified (blocking: a rename can take tens of ms on a busy disk).

        A shard marked here is re-hashed on restart before it is trusted, so a marker that reaches
        the disk before its data does costs a re-fetch, never a bad shard. Retention deletes a step
        on the trio loop while this runs in the fetch's thread: a step gone meanwhile has nothing
        left to record (raised, it ended the overlay, which a supervisor then restarted).
        """
        if not checkpoint.complete:
            try:
                write_durably(checkpoint.directory / VERIFIED_FILE, bytes(checkpoint.verified))
            except FileNotFoundError:
                log.info("step %d was dropped while its verified shards were saved", checkpoint.step)

    def write_delta(self, checkpoint: Checkpoint, body: bytes) -> None:
        """Keep the delta body that made ``checkpoint`` (before ``finalize``: one rename covers both,
        and its background sync makes the body durable with the data)."""
        (checkpoint.directory / DELTA_FILE).write_bytes(body)

    def discard(self, checkpoint: Checkpoint) -> None:
        """Forget a partial checkpoint and delete its directory (a delta that did not give it)."""
        if self.checkpoints.get(checkpoint.step) is checkpoint:
            del self.checkpoints[checkpoint.step]
        self._remove(checkpoint.directory)

    def finalize(self, checkpoint: Checkpoint) -> Future[None]:
        """Make a fully verified checkpoint complete now and durable soon: the ``unsynced`` marker,
        one atomic directory rename, then the data file's fsync in the background (the returned
        future), which removes the marker. Every byte was hashed against the signed manifest from
        the page cache that readers use, so nothing waits on the disk; only a crash before the fsync
        costs something: the restart hashes the step again (``reopen``). Blocking (run it in a
        worker thread); the caller then calls ``checkpoint.bump()``."""
        if checkpoint.verified_count != checkpoint.manifest.shard_count:
            raise ValueError(f"step {checkpoint.step} has unverified shards")
        (checkpoint.directory / VERIFIED_FILE).unlink(missing_ok=True)
        (checkpoint.directory / UNSYNCED_FILE).touch()  # before the rename: metadata reaches the disk in order
        final = self._dir(checkpoint.step, partial=False)
        self._remove(final)
        os.rename(checkpoint.directory, final)
        checkpoint.directory = final
        checkpoint.completed_at = time.time()
        # no bump() here: this runs in a worker thread, and a trio.Event is set only from trio's
        # own thread; the caller wakes the waiters once the thread has returned
        return _STEP_DIR_SYNCER.submit(self._make_durable, final)

    def _make_durable(self, directory: Path) -> None:
        """fsync a complete step's files (data, manifest, a delta body kept) and the rename that
        completed it, then drop its marker (a step pruned meanwhile is simply gone)."""
        try:
            for name in (DATA_FILE, MANIFEST_FILE, DELTA_FILE):
                if name != DELTA_FILE or (directory / name).exists():
                    fsync_file(directory / name)
            fsync_directory(self.root)
            (directory / UNSYNCED_FILE).unlink()
        except FileNotFoundError:
            return
        except OSError as exc:  # the marker stays: a restart hashes the step again
            log.warning("could not sync %s to disk: %s", directory.name, exc)

    def open_data(self, checkpoint: Checkpoint) -> int:
        """A read-only descriptor of the checkpoint's data file, wherever it is now. ``finalize``
        runs in a worker thread and renames the directory before ``checkpoint.directory`` says
        so: a request served in between must find the file under its complete name, not fail
        (the server closed such connections unanswered, and fetchers charged it with truncation:
        honest nodes banned each other in the demo). FileNotFoundError if it is gone."""
        for directory in (checkpoint.directory, self._dir(checkpoint.step, partial=False)):
            try:
                return os.open(directory / DATA_FILE, os.O_RDONLY)
            except FileNotFoundError:
                continue
        raise FileNotFoundError(f"step {checkpoint.step}: no data file")

    def open_delta(self, checkpoint: Checkpoint) -> int:
        """A read-only descriptor of the step's delta body; FileNotFoundError if none is kept."""
        return os.open(checkpoint.delta_path, os.O_RDONLY)

    # ---- publishing ------------------------------------------------------------------------

    def staging_path(self, step: int) -> Path:
        """Where a publisher puts a new file before its manifest exists (removed on restart)."""
        return self.root / f"publish-{step:012d}.tmp"

    def add_published(self, staged: Path, signed: Signed[CheckpointManifest], envelope: bytes,
                      delta: bytes | None = None) -> Checkpoint:
        """Move a staged file whose manifest this node signed into place, complete at once (with
        the delta body its manifest names, if any)."""
        manifest = signed.message
        tmp = self.root / f"publish-{manifest.step:012d}.dir.tmp"
        self._remove(tmp)
        tmp.mkdir(mode=0o700)
        (tmp / MANIFEST_FILE).write_bytes(envelope)  # no fsync: the background sync below covers it
        if delta is not None:
            (tmp / DELTA_FILE).write_bytes(delta)
        (tmp / UNSYNCED_FILE).touch()  # synced in the background, as a completed fetch is
        os.rename(staged, tmp / DATA_FILE)
        final = self._dir(manifest.step, partial=False)
        self._remove(final)
        os.rename(tmp, final)
        checkpoint = Checkpoint(manifest, envelope, final, bytearray([1]) * manifest.shard_count, origin=True,
                                completed_at=time.time())
        self.checkpoints[manifest.step] = checkpoint
        _STEP_DIR_SYNCER.submit(self._make_durable, final)
        return checkpoint

    def replace_envelope(self, checkpoint: Checkpoint, envelope: bytes) -> None:
        """Keep the freshest signed copy of a manifest (re-announcements extend its expiry)."""
        checkpoint.envelope = envelope
        write_durably(checkpoint.directory / MANIFEST_FILE, envelope)

    # ---- retention -------------------------------------------------------------------------

    def prune(self, keep: int, pinned: frozenset[int] = frozenset()) -> list[int]:
        """Delete every step but the newest ``keep`` and the ``pinned`` ones (the frozen base an
        adapter applies to); returns the deleted steps."""
        unpinned = sorted(step for step in self.checkpoints if step not in pinned)
        doomed = unpinned[:max(0, len(unpinned) - keep)]
        for step in doomed:
            self._remove(self.checkpoints.pop(step).directory)
        return doomed

    def held(self) -> list[Checkpoint]:
        """The checkpoints held now, copied in one step: ``begin`` adds one from the fetch's worker
        thread, and a loop over the live dict on the trio loop (the status, the newest complete)
        would then raise "dictionary changed size during iteration"."""
        return list(self.checkpoints.values())

    def newest_complete(self) -> Checkpoint | None:
        complete = [c for c in self.held() if c.complete]
        return max(complete, key=lambda c: c.step) if complete else None

    def _remove(self, path: Path) -> None:
        if path.parent != self.root:
            raise ValueError(f"refusing to remove {path}: not directly under {self.root}")
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _drop_torn_delta(path: Path, manifest: CheckpointManifest) -> None:
    """Delete a delta body kept beside a step whose sync had not finished, unless it is the one
    the signed manifest names: served torn, its holder would be charged by every follower."""
    kept, ref = path / DELTA_FILE, manifest.delta
    if not kept.exists():
        return
    try:
        with open(kept, "rb") as f:
            body = f.read(ref.size + 1) if ref is not None else b""
    except OSError:
        body = b""
    if ref is None or len(body) != ref.size or delta_hash(body) != ref.hash:
        log.warning("step %d's delta body did not reach the disk whole: deleted, the step is kept", manifest.step)
        kept.unlink(missing_ok=True)
