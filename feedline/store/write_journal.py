"""The journal of a write that can resume after a crash (``ds.write(path, resume=True)``).

A local write whose plan streams its read tasks in order (no ``limit``, no class
``map_batches``) keeps, in its staging folder (:mod:`feedline.store.commit`), a small JSON
file ``_resume.json``: what the write is (the plan's and the input's fingerprints, the number
of read tasks, the shard options, the fitted preprocessors, the dataset version it started
from, the write id) and every shard it has completed, each with its checksum and the
*position* after its last row: ``(task, rows)``, the read task whose output the shard
ended in and how many of that task's output rows it holds. It is JSON lines: the first line
(written atomically, temporary file and ``os.replace``) says what the write is, and each
completed shard appends one line (a torn last line, from a crash in the middle of it, is
ignored), so journaling costs one small write per shard however many shards there are.

A write killed before its commit leaves the staging folder. Re-run with ``resume=True``, the
same plan finds the journal, checks that nothing that decides the bytes changed (else a
:class:`~feedline.errors.ConfigurationError` says what differs), verifies each journaled
shard (size and sha256) and keeps the verified prefix; then it reuses the write id (the
shard names), runs only the read tasks from the position after the last verified shard
(skipping that task's rows already written) and writes the rest of the shards with the
same shard writer settings (row-group size, tensor storage). The shards are then the
bytes an uninterrupted write produces, and so is the manifest but for its times and
the write's execution report. No unique-ID column is needed: a task is named by its index
in the plan's deterministic task split.

The Spark and Ray engines run the read tasks in *units* (contiguous ranges of them: a
Spark partition, a Ray task), each writing its own shards. There the journal's first line
also holds the split into units (:attr:`Journal.units`), and each unit keeps a
:class:`UnitRecord`, one small JSON file ``_resume-unit-<n>.json`` in the staging folder,
replaced whole (temporary file and ``os.replace`` on local disk, one PUT on object stores)
each time one of its shards is complete: its shards with their checksums and positions,
and at its end that it is complete. A resume keeps the complete units whose shards all
verify (size and sha256), continues every other unit after its last verified shard, as
the local engine does, and runs the units with no record from their start
(:mod:`feedline.engines.write_resume`).

Examples
--------
>>> import tempfile
>>> from feedline.io.storage.paths import resolve
>>> staging = resolve(tempfile.mkdtemp())
>>> journal = Journal.start({"plan_fingerprint": "abc", "read_tasks": 3}, "0a1b2c3d4e5f")
>>> journal.save(staging)
>>> Journal.load(staging).identity["read_tasks"], Journal.load(staging).write_id
(3, '0a1b2c3d4e5f')
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import uuid
from dataclasses import dataclass, field
from typing import Any

from feedline.errors import ConfigurationError
from feedline.io.storage.paths import Location
from feedline.store.manifest import ShardInfo
from feedline.store.shards import file_checksum
from feedline.store.stored_files import read_small

__all__ = [
    "JOURNAL_NAME",
    "UNIT_PREFIX",
    "Journal",
    "JournalShard",
    "UnitRecord",
    "differences",
    "refuse",
    "save_whole",
]

JOURNAL_NAME = "_resume.json"
#: the name of a completed unit's record in the staging folder: ``_resume-unit-<n>.json``
UNIT_PREFIX = "_resume-unit-"
#: a journal larger than this is not one feedline wrote (ignored)
_MAX_JOURNAL_BYTES = 64 << 20
_FORMAT = 1

#: what each identity field means, for the message of a refused resume
_MEANING = {
    "plan_fingerprint": "the plan (its steps or their parameters)",
    "functions": "the code of the plan's functions or the plain values they read",
    "source_fingerprint": "the input (its files, sizes or snapshot)",
    "read_tasks": "the number of read tasks the input splits into",
    "options": "the shard options (rows_per_shard, bytes_per_shard, row groups, compression)",
    "preprocessors": "the fitted preprocessor state",
    "base": "the dataset version the write started from (another write committed since)",
    "engine": "the engine (and its shard layout)",
    "mode": "the write mode",
}


@dataclass(frozen=True)
class JournalShard:
    """A completed shard and the position after its last row: ``rows`` output rows of read
    task ``task`` are in this or earlier shards."""

    shard: ShardInfo
    task: int
    rows: int


@dataclass
class Journal:
    """What a resumable write is, and the shards it completed (see the module docs)."""

    identity: dict[str, Any]
    write_id: str
    #: the shard writer's settings decided on the first rows, restored on resume
    writer: dict[str, Any] = field(default_factory=dict)
    shards: list[JournalShard] = field(default_factory=list)
    #: a write in units: the first read task of each unit, then the number of read tasks
    #: (unit ``n`` runs tasks ``units[n]`` to ``units[n + 1] - 1``); empty otherwise
    units: list[int] = field(default_factory=list)

    @classmethod
    def start(
        cls, identity: dict[str, Any], write_id: str, units: list[int] | None = None
    ) -> Journal:
        """A journal of no shard yet (of a write in ``units``, when given)."""
        return cls(json.loads(json.dumps(identity)), write_id, units=list(units or []))

    def to_json(self) -> str:
        """The journal as JSON lines: what the write is, then its writer settings and
        shards."""
        head = {"format": _FORMAT, "write_id": self.write_id, "identity": self.identity}
        if self.units:
            head["units"] = self.units
        lines = [json.dumps(head, sort_keys=True)]
        if self.writer:
            lines.append(json.dumps({"writer": self.writer}, sort_keys=True))
        lines += [_shard_line(s) for s in self.shards]
        return "".join(line + "\n" for line in lines)

    def save(self, staging: Location) -> None:
        """Replace the journal in ``staging`` atomically (:func:`save_whole`)."""
        save_whole(staging, JOURNAL_NAME, self.to_json().encode())

    def add(self, staging: Location, entry: JournalShard, writer: dict[str, Any]) -> None:
        """Note a completed shard (and the writer's settings, when they changed) by
        appending to the journal :meth:`save` wrote."""
        lines = []
        if writer != self.writer:
            self.writer = dict(writer)
            lines.append(json.dumps({"writer": self.writer}, sort_keys=True))
        self.shards.append(entry)
        lines.append(_shard_line(entry))
        with open(staging.join(JOURNAL_NAME), "a", encoding="utf-8") as handle:
            handle.write("".join(line + "\n" for line in lines))

    @classmethod
    def load(cls, staging: Location) -> Journal | None:
        """The journal in ``staging``; ``None`` when there is none or it is not readable."""
        try:
            text = read_small(staging.child(JOURNAL_NAME), _MAX_JOURNAL_BYTES, what="a journal")
            first, *rest = text.decode().split("\n")
            doc = json.loads(first)
            if doc.get("format") != _FORMAT:
                return None
            journal = cls(dict(doc["identity"]), str(doc["write_id"]))
            journal.units = [int(n) for n in doc.get("units", [])]
        except Exception:  # noqa: BLE001 - missing, torn or foreign: nothing to resume
            return None
        for line in rest:
            try:
                item = json.loads(line)
                if "writer" in item:
                    journal.writer = dict(item["writer"])
                    continue
                shard = item["shard"] | {"row_groups": tuple(item["shard"]["row_groups"])}
                entry = JournalShard(ShardInfo(**shard), int(item["task"]), int(item["rows"]))
            except Exception:  # noqa: BLE001 - a torn last line (or an empty one): stop
                break
            journal.shards.append(entry)
        return journal

    def verified(self, staging: Location) -> list[JournalShard]:
        """The journaled shards, in order, up to the first one whose file is missing or
        whose size or sha256 differs from the journal's."""
        kept = []
        for entry in self.shards:
            try:
                size, checksum = file_checksum(staging.child(entry.shard.path))
            except Exception:  # noqa: BLE001 - missing or unreadable: redo from here
                break
            if (size, checksum) != (entry.shard.bytes, entry.shard.checksum):
                break
            kept.append(entry)
        return kept


@dataclass(frozen=True)
class UnitRecord:
    """The progress of a unit of read tasks (``first`` and the ``count`` after it): its
    completed shards (paths relative to the staging folder) in order, each with the
    position after its last row (``positions``: ``(task, rows)``, as :class:`JournalShard`),
    the shard writer's settings, and whether the unit is ``complete``.

    Examples
    --------
    >>> import tempfile
    >>> from feedline.io.storage.paths import resolve
    >>> staging = resolve(tempfile.mkdtemp())
    >>> UnitRecord(3, 30, 10, (), complete=True).save(staging)
    >>> UnitRecord.load_all(staging)[3].first, UnitRecord.load_all(staging)[3].complete
    (30, True)
    """

    unit: int
    first: int
    count: int
    shards: tuple[ShardInfo, ...]
    positions: tuple[tuple[int, int], ...] = ()
    writer: dict[str, Any] = field(default_factory=dict)
    complete: bool = False

    def save(self, staging: Location) -> None:
        """Write this record into ``staging``, whole (:func:`save_whole`), replacing the
        unit's previous one."""
        doc = {
            "format": _FORMAT,
            "unit": self.unit,
            "first": self.first,
            "count": self.count,
            "shards": [dataclasses.asdict(s) for s in self.shards],
            "positions": [list(p) for p in self.positions],
            "writer": self.writer,
            "complete": self.complete,
        }
        save_whole(staging, f"{UNIT_PREFIX}{self.unit:06d}.json", json.dumps(doc).encode())

    @classmethod
    def load_all(cls, staging: Location) -> dict[int, UnitRecord]:
        """The readable unit records in ``staging``, by unit (a torn or foreign one is
        left out: its unit runs again)."""
        found: dict[int, UnitRecord] = {}
        try:
            names = [
                posixpath.basename(p.rstrip("/")) for p in staging.fs.ls(staging.path, detail=False)
            ]
        except FileNotFoundError:
            return found
        for name in sorted(names):
            if not (name.startswith(UNIT_PREFIX) and name.endswith(".json")):
                continue
            try:
                text = read_small(staging.child(name), _MAX_JOURNAL_BYTES, what="a unit record")
                doc = json.loads(text)
                if doc.get("format") != _FORMAT:
                    continue
                shards = tuple(
                    ShardInfo(**(s | {"row_groups": tuple(s["row_groups"])})) for s in doc["shards"]
                )
                positions = tuple((int(t), int(r)) for t, r in doc.get("positions", []))
                if len(positions) != len(shards):
                    continue
                record = cls(
                    int(doc["unit"]),
                    int(doc["first"]),
                    int(doc["count"]),
                    shards,
                    positions,
                    dict(doc.get("writer") or {}),
                    bool(doc.get("complete")),
                )
            except Exception:  # noqa: BLE001 - torn or foreign: the unit runs again
                continue
            found[record.unit] = record
        return found

    def verified(self, staging: Location) -> UnitRecord:
        """This record cut at its first shard that is missing from ``staging`` or whose
        size or sha256 differs (then no longer ``complete``)."""
        for number, shard in enumerate(self.shards):
            try:
                size, checksum = file_checksum(staging.child(shard.path))
            except Exception:  # noqa: BLE001 - missing or unreadable: redo from here
                size, checksum = -1, ""
            if (size, checksum) != (shard.bytes, shard.checksum):
                return dataclasses.replace(
                    self,
                    shards=self.shards[:number],
                    positions=self.positions[:number],
                    complete=False,
                )
        return self


def save_whole(folder: Location, name: str, data: bytes) -> None:
    """Write the small file ``folder/name`` so that a reader sees it whole or not at all:
    on local disk a temporary file renamed over it, on object stores one PUT (an object
    appears whole)."""
    if not folder.is_local:
        folder.fs.pipe_file(folder.join(name), data)
        return
    os.makedirs(folder.path, exist_ok=True)
    path = folder.join(name)
    temporary = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def _shard_line(entry: JournalShard) -> str:
    return json.dumps(
        {"shard": dataclasses.asdict(entry.shard), "task": entry.task, "rows": entry.rows},
        sort_keys=True,
    )


def differences(journal: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between an interrupted write's identity and this write's, in words.

    Examples
    --------
    >>> differences({"read_tasks": 3, "mode": "overwrite"}, {"read_tasks": 4, "mode": "overwrite"})
    ['the number of read tasks the input splits into (was 3, now 4)']
    """
    found = []
    for key in sorted(set(journal) | set(now)):
        if journal.get(key) != now.get(key):
            was, is_ = _short(journal.get(key)), _short(now.get(key))
            found.append(f"{_MEANING.get(key, key)} (was {was}, now {is_})")
    return found


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 160 else text[:157] + "..."


def refuse(target: Location, found: list[str]) -> ConfigurationError:
    """The error of a resume whose plan or input differs from the interrupted write's."""
    return ConfigurationError(
        f"Cannot resume the interrupted write to {target.url!r}: "
        + "; ".join(found)
        + ". Resuming would mix the shards of two different writes. Fix: re-run the write "
        "with the interrupted write's plan and input, or without resume=True to start a "
        "fresh write (its commit removes the interrupted write's files)."
    )
