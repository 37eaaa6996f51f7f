"""Archives of cut log records: the `ArchiveSink` protocol and `DirectoryArchive`.

Before compaction cuts a prefix of a partition, every record in it is written to an archive and
made durable, so audit keeps the whole history: ``onward replay --archive`` and
``onward projections rebuild --archive`` read archive plus log as one (`ArchivedEventLog`).

`DirectoryArchive` keeps one file per archived range of one partition, JSON Lines compressed
with zstd (each line the record's offset, its run and the event: its record as the log held it,
when the writer read it so, else as the codec encodes it), and a
manifest holding every range with its event count, size and SHA-256. A file and then the
manifest are each written to a temporary name, fsynced, renamed into place, and the directory
fsynced: a crash leaves either the old manifest or the new one, never half of one, and a range
is in the archive once its manifest entry is. Writing a range the manifest already holds checks
the file and returns the entry, so a compactor rerun after a crash recognises its own work.

The archive holds whole histories, so its directory is created 0700 and its files 0600 whatever
the umask, and a temporary file is created afresh (never opened through a link planted in its
place). A manifest is trusted no further than its directory: an entry must name the file this
code would have written for its range, inside the archive, and a file is decompressed line by
line with each line bounded, so a manifest pointing elsewhere or a decompression bomb is an
`ArchiveError`, not a read of another file or an exhausted memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec
import zstandard

from onward.errors import (
    ArchiveError,
    BackendUnavailableError,
    ConfigurationError,
    InvalidInputError,
)

from .base import LogRecord, Position, StoredEvent, decode_record, record_bytes

if sys.platform != "win32":
    import fcntl

ARCHIVE_FORMAT = 1
"""Version of the manifest and of the line layout; a newer one is refused, not guessed at."""
MANIFEST = "manifest.json"
MAX_LINE_BYTES = 32 * 1024 * 1024
"""The longest line a file may decompress to: far above any record a log accepts (1 MB by
default), so only a damaged or hostile file reaches it."""
_CHUNK_BYTES = 1024 * 1024
CURSORS = 16
"""Of how many partitions a read keeps its place in the file it read (the least recently read
one's dropped): a rebuild reads a page of every partition in turn (12 by default), and with
one file kept for all it decoded every file again at every page. A place holds the file
compressed and the decompressor's state, a few MB at most, never the file's events."""
LOCK_TIMEOUT_S = 60.0
"""How long a write waits for another process's hold on the directory before it gives up: a
holder that is stuck (or a lock kept by hand) fails the pass instead of hanging it, shutdown
included, since the thread waiting cannot be cancelled."""
_LOCK_POLL_S = 0.05
DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def file_name(partition: int, start: int, end: int) -> str:
    """The name of the file holding ``[start, end)`` of a partition: the only name a manifest
    entry may give."""
    return f"p{partition:05d}-{start:012d}-{end:012d}.jsonl.zst"


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


class _Cursor:
    """A place in one file whose lines are in offset order, checked whole: a reader paging
    on from it decodes each line once, and holds no more than a page of events."""

    def __init__(self, entry: ArchivedRange, lines: Iterator[_Line]) -> None:
        self.entry = entry
        self._lines = lines
        self._next = next(lines, None)
        self.at = entry.start
        """The lowest offset a read may ask for to go on from here."""

    def take(self, low: int, high: int) -> list[LogRecord]:
        """The records from ``low`` up to ``high``, ``low`` at least `at`."""
        out: list[LogRecord] = []
        line = self._next
        while line is not None and line.offset < high:
            if line.offset >= low:
                position = Position(self.entry.partition, line.offset)
                out.append(decode_record(position, line.event, run_hint=line.run_id))
            line = next(self._lines, None)
        self._next = line
        self.at = high
        return out


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

        A range already archived exactly is checked and returned as it is. Each record is
        kept as `record_bytes` gives it: the bytes the log held, when the compactor read them
        so, with every field a newer writer added.

        Raises:
            InvalidInputError: A record lies outside the range or is not past the one before
                it (records come in offset order, each offset once), the range overlaps
                another, or it is empty or inverted (``start >= end``).
            ConfigurationError: The archive cannot be written (missing rights, not a directory).
            ArchiveError: An existing file or the manifest differs from what was written.
        """
        ...

    async def read(self, partition: int, start: int, end: int) -> list[LogRecord]:
        """The archived records of a partition with offsets in ``[start, end)``, in order.

        A record that cannot be decoded (a newer Onward's format) comes back in its place as
        an `UnreadableRecord`, as a log's `read_records` gives it, so a rebuild sets its run
        aside and folds every other one.

        Raises:
            ArchiveError: A file or the manifest differs from what was written.
        """
        ...


class DirectoryArchive:
    """An `ArchiveSink` in one directory of a file system (local or mounted).

    Args:
        path: The directory; created (with parents) on the first write. A relative one is
            taken from the working directory now, and named so: a cut records its `location`
            for readers that run from elsewhere.
        level: The zstd compression level.
    """

    def __init__(self, path: str | Path, *, level: int = 3) -> None:
        self.path = Path(path).absolute()
        self._level = level
        self._lock = asyncio.Lock()
        self._cursors: dict[int, _Cursor] = {}

    @property
    def location(self) -> str:
        return str(self.path)

    async def ready(self) -> None:
        async with self._lock:
            await asyncio.to_thread(self._probe)
        await asyncio.to_thread(self._load)

    def _probe(self) -> None:
        probe = self.path / ".onward-probe"
        try:
            self._make_directory()
            held = self._hold_directory()
            try:
                _durable_write(probe, b"")
                probe.unlink()
            finally:
                _release(held)
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _hold_directory(self) -> int | None:
        """Take ``flock`` on the directory itself, waiting for its holder at most
        `LOCK_TIMEOUT_S`; release it with `_release`. Every process writing this archive holds
        it from reading the manifest to renaming the new one into place, so two passes never
        interleave (one would drop the other's entry, or rename the other's half-written
        temporary file). Where ``flock`` does not exist (Windows), it locks nothing.

        Raises:
            BackendUnavailableError: Another process held the lock for the whole timeout.
        """
        if sys.platform == "win32":
            return None
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            taken = self._wait_for_lock(fd)
        except BaseException:
            os.close(fd)
            raise
        if not taken:
            os.close(fd)
            raise BackendUnavailableError(
                f"archive {self.path}: another process has held its lock (flock on the "
                f"directory) for over {LOCK_TIMEOUT_S:g}s; nothing was written or cut. "
                "Run again once the other compaction ends, or stop the process holding it"
            )
        return fd

    def _wait_for_lock(self, fd: int) -> bool:
        """Take ``flock`` on ``fd``, trying for `LOCK_TIMEOUT_S`; whether it was taken."""
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_LOCK_POLL_S)
            else:
                return True

    def _make_directory(self) -> None:
        """Create the directory (and its parents) if missing; the directory itself 0700. Each
        one created is synced into its parent: the files' syncs keep their own entries, not
        the directory's name, and a crash after a cut would lose the whole archive. One found
        there is synced into its parent too: a process that crashed after making it never
        synced it, and nothing tells its directory from one that was."""
        missing = list(
            itertools.takewhile(lambda d: not d.exists(), [self.path, *self.path.parents])
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir(mode=DIRECTORY_MODE)
        except FileExistsError:
            _sync_directory(self.path.parent)
            return
        os.chmod(self.path, DIRECTORY_MODE)  # in case the umask took more than it should
        for created in reversed(missing):
            _sync_directory(created.parent)

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
        if partition < 0 or start < 0 or start >= end:
            # An entry of an empty or inverted range would overlap, by the manifest's test,
            # every later range around it, and refuse them all.
            raise InvalidInputError(
                f"archive of partition {partition} [{start}, {end}): not a range of offsets "
                "(the partition and start must be at least 0, the end past the start)"
            )
        after = start - 1
        for stored in records:
            position = stored.position
            if position.partition != partition or not start <= position.offset < end:
                raise InvalidInputError(
                    f"archive of partition {partition} [{start}, {end}): a record at partition "
                    f"{position.partition} offset {position.offset} lies outside it"
                )
            if position.offset <= after:
                # A read gives them back in the order written, and promises offset order.
                raise InvalidInputError(
                    f"archive of partition {partition} [{start}, {end}): the record at offset "
                    f"{position.offset} comes after the one at offset {after}; records are "
                    "archived in offset order, each offset once"
                )
            after = position.offset
        async with self._lock:
            return await asyncio.to_thread(self._write, partition, start, end, records)

    async def read(self, partition: int, start: int, end: int) -> list[LogRecord]:
        found: list[LogRecord] = []
        for entry in await self.ranges(partition):
            low, high = max(start, entry.start), min(end, entry.end)
            if low >= high:
                continue
            found.extend(await self._records(entry, low, high))
        return found

    async def _records(self, entry: ArchivedRange, low: int, high: int) -> list[LogRecord]:
        """The records of ``entry``'s file in ``[low, high)``: from the partition's place in
        it when the read goes on from there, else from a place opened afresh and kept."""
        cursor = self._cursors.pop(entry.partition, None)  # one reader of a place at a time
        if cursor is None or cursor.entry != entry or low < cursor.at:
            cursor = await asyncio.to_thread(self._open, entry)
            if cursor is None:
                return await asyncio.to_thread(self._read_file, entry, low, high)
        records = await asyncio.to_thread(cursor.take, low, high)
        self._cursors[entry.partition] = cursor
        while len(self._cursors) > CURSORS:
            del self._cursors[next(iter(self._cursors))]
        return records

    def _open(self, entry: ArchivedRange) -> _Cursor | None:
        """A place at the start of ``entry``'s file, checked whole first (digest, count,
        order); ``None`` when its lines are not in offset order (an older writer's), which is
        read whole instead."""
        body = self._body(entry)
        lines = self._checked_lines(entry, body)
        if any(a.offset > b.offset for a, b in itertools.pairwise(lines)):
            return None
        del lines
        decoder = msgspec.json.Decoder(_Line)
        return _Cursor(entry, (decoder.decode(raw) for raw in self._lines(entry, body)))

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
        except (msgspec.DecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            raise ArchiveError(
                f"archive {self.path}: {MANIFEST} is corrupt ({exc}); nothing is archived or cut "
                "until it is restored from a copy"
            ) from exc
        if manifest.format > ARCHIVE_FORMAT:
            raise ArchiveError(
                f"archive {self.path}: manifest format {manifest.format} is newer than this code "
                f"reads ({ARCHIVE_FORMAT}); upgrade Onward"
            )
        for entry in manifest.ranges:
            self._check_name(entry)
            for field, value in (("partition", entry.partition), ("start", entry.start)):
                if value < 0:
                    # No log has one and no write records one: damage, not an older writer's.
                    raise ArchiveError(
                        f"archive {self.path}: {MANIFEST} entry for {entry.file!r} has "
                        f"{field} {value}, below 0; nothing is read from it until the manifest "
                        "is restored from a copy"
                    )
            if entry.start >= entry.end and entry.events:
                raise ArchiveError(
                    f"archive {self.path}: {MANIFEST} entry for partition {entry.partition} "
                    f"[{entry.start}, {entry.end}) covers no offset yet counts {entry.events} "
                    "records; nothing is read from it until the manifest is restored from a copy"
                )
        # An empty or inverted range an older writer recorded holds nothing, and would refuse,
        # as overlapping it, every range about it: it is left out (and of the next manifest).
        manifest.ranges = [e for e in manifest.ranges if e.start < e.end]
        return manifest

    def _check_name(self, entry: ArchivedRange) -> None:
        """Refuse an entry unless it names the file this archive writes for its range: a bare
        name, so no ``../other/...`` or absolute path. Checked for every entry at every load,
        so it touches no disk: resolving each path made a load cost a file system lookup per
        entry, and a read of a long archive, loading the manifest for every page, grow with
        the square of its size.

        Raises:
            ArchiveError: The entry names another file.
        """
        if entry.file != file_name(entry.partition, entry.start, entry.end):
            raise self._outside(entry)

    def _file_of(self, entry: ArchivedRange) -> Path:
        """The path of an entry's file, refused unless it is the file this archive writes for
        the entry's range, inside the archive (not a link out of it): a manifest cannot make a
        read leave it.

        Raises:
            ArchiveError: The entry names another file (``../other/...``, an absolute path, a
                name of another range) or one that resolves outside the archive.
        """
        self._check_name(entry)
        path = self.path / entry.file
        if path.resolve().parent != self.path.resolve():
            raise self._outside(entry)
        return path

    def _outside(self, entry: ArchivedRange) -> ArchiveError:
        expected = file_name(entry.partition, entry.start, entry.end)
        return ArchiveError(
            f"archive {self.path}: {MANIFEST} entry for partition {entry.partition} "
            f"[{entry.start}, {entry.end}) names file {entry.file!r}, not {expected!r} in "
            "the archive itself; nothing is read from it until the manifest is restored "
            "from a copy"
        )

    def _write(
        self, partition: int, start: int, end: int, records: Sequence[StoredEvent]
    ) -> ArchivedRange:
        try:
            self._make_directory()
            held = self._hold_directory()
        except OSError as exc:
            raise self._unwritable(exc) from exc
        try:
            return self._write_locked(partition, start, end, records)
        finally:
            _release(held)

    def _write_locked(
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
        name = file_name(partition, start, end)
        lines = b"".join(
            msgspec.json.encode(_Line(s.position.offset, s.event.run_id, _event_of(s))) + b"\n"
            for s in records
        )
        body = zstandard.ZstdCompressor(level=self._level).compress(lines)
        try:
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

    def _read_file(
        self, entry: ArchivedRange, low: int | None = None, high: int | None = None
    ) -> list[LogRecord]:
        """The records of ``entry``'s file with offsets in ``[low, high)`` (all by default),
        in offset order, the whole file checked (digest, count, order)."""
        lines = self._checked_lines(entry, self._body(entry))
        low = entry.start if low is None else low
        high = entry.end if high is None else high
        return [
            decode_record(Position(entry.partition, line.offset), line.event, run_hint=line.run_id)
            for line in sorted(lines, key=lambda line: line.offset)
            if low <= line.offset < high
        ]

    def _body(self, entry: ArchivedRange) -> bytes:
        """The bytes of ``entry``'s file, checked against the manifest's size and digest."""
        path = self._file_of(entry)
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
        return body

    def _checked_lines(self, entry: ArchivedRange, body: bytes) -> list[_Line]:
        """The lines of ``entry``'s file in the order written, checked: as many as the
        manifest counts, each offset once and inside its range (`_in_order`)."""
        decoder = msgspec.json.Decoder(_Line)
        lines: list[_Line] = []
        try:
            for raw in self._lines(entry, body):
                if len(lines) == entry.events:
                    raise self._miscounted(entry, "more")
                lines.append(decoder.decode(raw))
        except (zstandard.ZstdError, msgspec.DecodeError, RecursionError) as exc:
            raise ArchiveError(
                f"archive {self.path}: {entry.file} cannot be read back ({exc}); restore it "
                "from a copy"
            ) from exc
        if len(lines) != entry.events:
            raise self._miscounted(entry, str(len(lines)))
        self._in_order(entry, lines)
        return lines

    def _in_order(self, entry: ArchivedRange, lines: list[_Line]) -> list[_Line]:
        """A file's records in offset order, as a read promises: an older writer archived them
        in the order given. One outside the entry's range, or at an offset another holds too,
        is an `ArchiveError`: the range was not archived so, and which one the log held at
        that offset cannot be told."""
        ordered = sorted(lines, key=lambda line: line.offset)
        previous: int | None = None
        for line in ordered:
            offset = line.offset
            if offset == previous or not entry.start <= offset < entry.end:
                what = (
                    f"two records at offset {offset}"
                    if offset == previous
                    else f"a record at offset {offset}, outside its range [{entry.start}, "
                    f"{entry.end})"
                )
                raise ArchiveError(
                    f"archive {self.path}: {entry.file} holds {what}; restore it from a copy"
                )
            previous = offset
        return ordered

    def _miscounted(self, entry: ArchivedRange, held: str) -> ArchiveError:
        return ArchiveError(
            f"archive {self.path}: {entry.file} holds {held} records, the manifest says "
            f"{entry.events}"
        )

    def _lines(self, entry: ArchivedRange, body: bytes) -> Iterator[bytes]:
        """The lines a file decompresses to, streamed, each at most `MAX_LINE_BYTES`: a frame
        claiming (or holding) more is refused before it is held in memory. A blank line is
        given too, to be refused as no record: no writer leaves one, and a file of a few MB
        can decompress to terabytes of them, read for hours, were they passed over."""
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        pending = bytearray()
        while chunk := reader.read(_CHUNK_BYTES):
            pending += chunk
            *complete, rest = pending.split(b"\n")
            yield from (bytes(line) for line in complete)
            pending = rest
            if len(pending) > MAX_LINE_BYTES:
                raise ArchiveError(
                    f"archive {self.path}: {entry.file} decompresses to a line over "
                    f"{MAX_LINE_BYTES} bytes; no record is that long, so it is refused unread"
                )
        if pending:
            yield bytes(pending)


def _event_of(stored: StoredEvent) -> msgspec.Raw:
    """The record of ``stored`` as the log held it when read so (`keeping_records`), on one
    line: a newline in a record's JSON lies between its tokens (one in a string is escaped),
    so it is written as a space, which reads the same."""
    return msgspec.Raw(record_bytes(stored).replace(b"\n", b" "))


def _release(held: int | None) -> None:
    """Release what `DirectoryArchive._hold_directory` took: closing the descriptor does."""
    if held is not None:
        os.close(held)


def _durable_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that after a crash it is either whole or absent (or the
    old file): a temporary file, fsynced, renamed over ``path``, then the directory fsynced.

    The temporary file is created 0600 and exclusively, never through a link: one left by a
    crash (or a link planted in its place) is removed first, and a second one appearing
    meanwhile fails the write rather than being written through.
    """
    temporary = path.with_name(path.name + ".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(temporary, flags, FILE_MODE)
    except FileExistsError:
        temporary.unlink()  # removes a link itself, never what it points at
        fd = os.open(temporary, flags, FILE_MODE)
    with open(fd, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    temporary.replace(path)
    _sync_directory(path.parent)


def _sync_directory(path: Path) -> None:
    """Make the entries of the directory ``path`` durable (a rename, a name created in it)."""
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
