"""``<home>/verdicts``: one durable record per batch the validator is done with.

A batch leaves the inbox only once its record is on disk: its verdict envelope (or the note that it
was passed over or adopted), the counters credited, the contents it entered in the content index
and the cheats it proved; committed counters never delivered get an ``undelivered-`` record. A
restart reads them back to judge as the node did before (``JudgeState``) and to ban again. The
file format lives here, apart from ``ValidatorService``, so the service keeps only the judging.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from intellect_node.node.home.durable import write_durably
from intellect_node.node.roles.validator.commitments import Undelivered
from intellect_node.node.roles.validator.ledger import JudgeState, group_digest
from intellect_node.protocol.rollouts import RolloutBatch

log = logging.getLogger(__name__)


def batch_record(batch: RolloutBatch, envelope: bytes | None, accepted: Iterable[int] = (),
                 credited: Iterable[int] | None = None, cheats: Iterable[str] = ()) -> dict[str, Any]:
    """A judged or adopted batch: its verdict, the counters credited, the contents it entered in
    the content index, the cheats it proved, so a restart rebuilds the same ledger and bans."""
    counters = [g.counter for g in batch.groups] if credited is None else list(credited)
    contents = [group_digest(g.prompt_ids, [c.token_ids for c in g.completions]).hex()
                for g in batch.groups] if envelope is not None else []
    return {"worker": batch.worker, "step": batch.policy_step, "counters": counters,
            "verdict": envelope.hex() if envelope is not None else None,
            "accepted": list(accepted), "contents": contents, "cheats": list(cheats)}


def unjudged_record(header: RolloutBatch, counters: list[int]) -> dict[str, Any]:
    """An unsampled batch: its counters are used, nothing else of it is known here."""
    return {"worker": header.worker, "step": header.policy_step, "counters": counters,
            "verdict": None, "accepted": [], "contents": [], "cheats": []}


class VerdictRecords:
    """The records in ``directory``: written durably, read back at start and by trusted verdicts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, digest: str, record: dict[str, Any]) -> None:
        write_durably(self.directory / f"{digest}.json", json.dumps(record).encode())

    def write_undelivered(self, item: Undelivered) -> None:
        log.info("worker %s left %d committed groups of step %d undelivered: settled as reward 0",
                 item.worker, len(item.counters), item.step)
        name = hashlib.sha256(f"{item.worker}/{item.step}".encode()).hexdigest()
        record = {"worker": item.worker, "step": item.step, "counters": [], "verdict": None, "accepted": [],
                  "contents": [], "cheats": [], "undelivered": list(item.counters), "reward": 0.0}
        write_durably(self.directory / f"undelivered-{name}.json", json.dumps(record).encode())

    def holds(self, digest: str) -> bool:
        """Whether ``digest`` was recorded (judged, passed over or adopted)."""
        return (self.directory / f"{digest}.json").exists()

    def load(self, seen: JudgeState) -> list[tuple[str, str]]:
        """Rebuild the counters and the content index in ``seen`` from the records, so a restart
        judges as the node did before; returns the (worker, cheats) its own verdicts proved."""
        proven = []
        for path in self.directory.glob("*.json"):
            try:
                record = json.loads(path.read_text())
                seen.credit(record["worker"], record["step"], record["counters"])
                for digest in record.get("contents", ()):
                    seen.contents.setdefault(bytes.fromhex(digest), record["step"])
                cheats = record.get("cheats", ())
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("unreadable verdict record %s: %s", path.name, exc)
                continue
            if cheats:
                proven.append((record["worker"], ", ".join(cheats)))
        return proven

    def own_accepted(self, digest: str) -> set[int] | None:
        """Counters this node accepted in ``digest`` by its own verification (None: not judged here)."""
        try:
            record = json.loads((self.directory / f"{digest}.json").read_text())
        except (OSError, ValueError):
            return None
        return set(record["accepted"]) if record.get("verdict") else None
