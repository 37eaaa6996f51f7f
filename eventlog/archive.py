"""Archives of cut log records: the `ArchiveSink` protocol and `DirectoryArchive`.

Before compaction cuts a prefix of a partition, every record in it is written to an archive and
made durable, so audit keeps the whole history: ``onward replay --archive`` and
``onward projections rebuild --archive`` read archive plus log as one (`ArchivedEventLog`).

`DirectoryArchive` keeps one file per archived range of one partition, JSON Lines compressed
with zstd (each line the record's offset, its run and the event as the codec encodes it), and a
manifest holding every range with its event count, size and SHA-256. A file and then the
manifest are each written to a temporary name, fsynced, renamed into place, and the directory
fsynced: a crash leaves either the old manifest or the new one, never half of one, and a range
is in the archive once its manifest entry is. Writing a range the manifest already holds checks
the file and returns the entry, so a compactor rerun after a crash recognises its own work.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec
import zstandard

from onward.errors import ArchiveError, ConfigurationError, InvalidInputError

from . import codec
from .base import Position, StoredEvent

ARCHIVE_FORMAT = 1
"""Version of the manifest and of the line layout; a newer one is refused, not guessed at."""
MANIFEST = "manifest.json"


class ArchivedRange(msgspec.Struct, frozen=True, kw_only=True):
    """One archived range of one partition.

    Attributes:
        partition: The partition.
        start: The first offset of the range.
        end: One past the last offset of the range.
        events: How many records the range held (offsets may be sparse on Kafka).
        file: The file's name inside the archive.
        size: The file's size in bytes.
        sha256: The file's SHA-256, hex.
    """

    partition: int
    start: int
    end: int
    events: int
    file: str
    size: int
    sha256: str


class _Manifest(msgspec.Struct, kw_only=True):
    format: int = ARCHIVE_FORMAT
    ranges: list[ArchivedRange] = []


class _Line(msgspec.Struct, frozen=True):
    offset: int
    run_id: str
    event: msgspec.Raw


@runtime_checkable
class ArchiveSink(Protocol):
    """Where compaction puts records before it cuts them, and where replay finds them again."""

    @property
    def location(self) -> str:
        """Where the archive is, as ``onward replay`` reports it (a path, a URL)."""
        ...

    async def ready(self) -> None:
        """Check the archive can be written and its manifest read, before anything is cut.

        Raises:
            ConfigurationError: The archive cannot be written.
            ArchiveError: The manifest cannot be read as written.
        """
        ...

    async def ranges(self, partition: int | None = None) -> list[ArchivedRange]:
        """The archived ranges, of one partition or all, by partition and start.

        Raises:
            ArchiveError: The manifest cannot be read as written.
        """
        ...

    async def write(
        self, partition: int, start: int, end: int, records: Sequence[StoredEvent]
    ) -> ArchivedRange:
        """Archive the records of ``[start, end)`` of a partition, durably, before returning.

        A range already archived exactly is checked and returned as it is.

        Raises:
            InvalidInputError: A record lies outside the range, or the range overlaps another.
            ConfigurationError: The archive cannot be written (missing rights, not a directory).
            ArchiveError: An existing file or the manifest differs from what was written.
        """
        ...

    async def read(self, partition: int, start: int, end: int) -> list[StoredEvent]:
        """The archived records of a partition with offsets in ``[start, end)``, in order.

        Raises:
            ArchiveError: A file or the manifest differs from what was written.
        """
        ...


class DirectoryArchive:
    """An `ArchiveSink` in one directory of a file system (local or mounted).

    Args:
        path: The directory; created (with parents) on the first write.
        level: The zstd compression level.
    """

    def __init__(self, path: str | Path, *, level: int = 3) -> None:
        self.path = Path(path)
        self._level = level
        self._lock = asyncio.Lock()
        self._cache: dict[str, list[StoredEvent]] = {}

    @property
    def location(self) -> str:
        return str(self.path)

    async def ready(self) -> None:
        await asyncio.to_thread(self._probe)
        await asyncio.to_thread(self._load)

    def _probe(self) -> None:
        probe = self.path / ".onward-probe"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            _durable_write(probe, b"")
            probe.unlink()
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _unwritable(self, exc: OSError) -> ConfigurationError:
        return ConfigurationError(
            f"archive {self.path} cannot be written ({exc.strerror or exc}); nothing was cut. "
            "Point --archive at a directory this process may write"
        )

    async def ranges(self, partition: int | None = None) -> list[ArchivedRange]:
        manifest = await asyncio.to_thread(self._load)
        return [r for r in manifest.ranges if partition is None or r.partition == partition]

    async def write(
        self, partition: int, start: int, end: int, records: Sequence[StoredEvent]
    ) -> ArchivedRange:
        for stored in records:
            position = stored.position
            if position.partition != partition or not start <= position.offset < end:
                raise InvalidInputError(
                    f"archive of partition {partition} [{start}, {end}): a record at partition "
                    f"{position.partition} offset {position.offset} lies outside it"
                )
        async with self._lock:
            return await asyncio.to_thread(self._write, partition, start, end, records)

    async def read(self, partition: int, start: int, end: int) -> list[StoredEvent]:
        found: list[StoredEvent] = []
        for entry in await self.ranges(partition):
            if entry.end <= start or entry.start >= end:
                continue
            events = self._cache.get(entry.file)
            if events is None:
                events = await asyncio.to_thread(self._read_file, entry)
                self._cache = {entry.file: events}  # one file kept: a rebuild reads in order
            found.extend(e for e in events if start <= e.position.offset < end)
        return found

    def _load(self) -> _Manifest:
        path = self.path / MANIFEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return _Manifest()
        except OSError as exc:
            raise ConfigurationError(f"archive {self.path}: cannot read {MANIFEST}: {exc}") from exc
        try:
            manifest = msgspec.json.decode(data, type=_Manifest)
        except msgspec.DecodeError as exc:
            raise ArchiveError(
                f"archive {self.path}: {MANIFEST} is corrupt ({exc}); nothing is archived or cut "
                "until it is restored from a copy"
            ) from exc
        if manifest.format > ARCHIVE_FORMAT:
            raise ArchiveError(
                f"archive {self.path}: manifest format {manifest.format} is newer than this code "
                f"reads ({ARCHIVE_FORMAT}); upgrade Onward"
            )
        return manifest

    def _write(
        self, partition: int, start: int, end: int, records: Sequence[StoredEvent]
    ) -> ArchivedRange:
        manifest = self._load()
        for entry in manifest.ranges:
            if entry.partition != partition or entry.end <= start or entry.start >= end:
                continue
            if (entry.start, entry.end) == (start, end):
                self._read_file(entry)  # already archived: it must still read back whole
                return entry
            raise InvalidInputError(
                f"archive {self.path}: partition {partition} [{start}, {end}) overlaps the "
                f"archived range [{entry.start}, {entry.end})"
            )
        name = f"p{partition:05d}-{start:012d}-{end:012d}.jsonl.zst"
        lines = b"".join(
            msgspec.json.encode(
                _Line(s.position.offset, s.event.run_id, msgspec.Raw(codec.encode(s.event)))
            )
            + b"\n"
            for s in records
        )
        body = zstandard.ZstdCompressor(level=self._level).compress(lines)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            _durable_write(self.path / name, body)
            entry = ArchivedRange(
                partition=partition,
                start=start,
                end=end,
                events=len(records),
                file=name,
                size=len(body),
                sha256=hashlib.sha256(body).hexdigest(),
            )
            manifest.ranges = sorted(
                [*manifest.ranges, entry], key=lambda r: (r.partition, r.start)
            )
            _durable_write(self.path / MANIFEST, msgspec.json.encode(manifest))
        except OSError as exc:
            raise self._unwritable(exc) from exc
        return entry

    def _read_file(self, entry: ArchivedRange) -> list[StoredEvent]:
        path = self.path / entry.file
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise ArchiveError(f"archive {self.path}: cannot read {entry.file}: {exc}") from exc
        digest = hashlib.sha256(body).hexdigest()
        if len(body) != entry.size or digest != entry.sha256:
            raise ArchiveError(
                f"archive {self.path}: {entry.file} has {len(body)} bytes with SHA-256 "
                f"{digest[:12]}…, the manifest says {entry.size} bytes and {entry.sha256[:12]}…"
            )
        decoder = msgspec.json.Decoder(_Line)
        events: list[StoredEvent] = []
        text = zstandard.ZstdDecompressor().decompress(body)
        for raw in text.splitlines():
            line = decoder.decode(raw)
            event = codec.decode(line.event, run_hint=line.run_id)
            events.append(StoredEvent(Position(entry.partition, line.offset), event))
        if len(events) != entry.events:
            raise ArchiveError(
                f"archive {self.path}: {entry.file} holds {len(events)} records, the manifest "
                f"says {entry.events}"
            )
        return events


def _durable_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that after a crash it is either whole or absent (or the
    old file): a temporary file, fsynced, renamed over ``path``, then the directory fsynced."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
