"""Soak: a million events of long runs with compaction on a schedule.

Long runs (``--live-runs`` at a time, each ``--run-length`` events, one model turn per append,
a new run taking the place of each that finishes) are written into a fresh log. Every
``--compact-every`` events the projector catches up and a `CheckpointCompactor` pass runs
(``--max-checkpoints`` resume points kept per live run, a directory archive), and then:

* log size: the records between each partition's start and end, and bytes. Kafka: the bytes of
  the topic's segment files (``*.log``; index files are preallocated) in the broker's log
  directory (found with DescribeConfigs), on disk now and kept (the broker deletes a segment
  lying wholly below the partition's start at its retention check, every five minutes by
  default, so the bytes on disk drop in steps). SQLite: the bytes of the pages of the log's
  table and index (``dbstat``);
* resume p50: ``--probes`` runs of ``--probe-turns`` settled turns are written by an
  `AgentRunner`, and ``AgentRunner.resume`` of each is timed ``--samples`` times (after
  ``--warmup`` untimed ones), from the call to the model's first call (lease, frontier row,
  transcript, tail, claim, plan, conversation); the probes are then carried to completion, so
  they are compacted like every finished run;
* archive completeness: the records in the archive, against the records cut.

Real traffic beside the long runs (each part on by default, each behind a flag):

* waiting runs (``--waiting-share`` of ``--live-runs``, plus ``--answer-per-round`` per round):
  runs of an `AgentRunner` that wait on a person (a tool with ``requires_approval``), written
  before any other traffic, so they are at the start of every partition. Each round
  ``--answer-per-round`` of them are approved and resumed (``AgentRunner.resume`` timed to the
  model's first call); at the end every other one is. Each must complete with its conversation
  whole: the first model call after the approval is sent exactly the messages its whole
  history (archive + log, `ArchivedEventLog`) gives, the approval's included;
* over the snapshot cap (``--over-cap``): one of the waiting runs asks approval for a call whose
  arguments are bigger than the projector's snapshot cap (``--snapshot-cap``), so its row has no
  frontier; the projector keeps it uncapped in the compaction store (as ``onward projector``
  does) and the run is compacted like any other; it is answered at the end like the others;
* LangGraph threads (``--threads``, ``--thread-puts`` checkpoints each per round): an
  `OnwardSaver` (``compaction=`` the soak's store) writes them; each round a fresh saver loads
  each thread's latest checkpoint (``aget_tuple``, timed), which must be the last one put;
* garbage collection (``--gc-every`` rounds): a `GarbageCollector` on the deployment's record
  (and Redis key) sweepers collects the finished long runs (their clock is in the past), which
  leaves tombstones, so compaction cuts their events without keeping any;
* quarantine (``--quarantine``): in the last round one run is written, then an unreadable record
  for it; the projector sets it aside and compaction keeps every event of it. Last, because an
  unreadable record is never cut: it holds its partition's watermark from there on.

Targets (issue: the history lifecycle): the log's records and bytes plateau (the last round
within 1.5x of the first after ``--warmup-rounds``) instead of growing with the events written;
resume p50 at the end within 1.2x of the start; archive records = records cut; every waiting run
completes with its conversation whole; every thread loads its latest checkpoint.

    python bench/soak.py --events 100000          # quick
    python bench/soak.py                            # 1,000,000 events on Kafka
    python bench/soak.py --backend sqlite --events 200000

The topic, the schema, the Redis keys, the SQLite file and the archive are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
from _workload import FirstCall, RunHistory, Stopwatch, search
from rich.console import Console
from rich.table import Table

from onward.eventlog import (
    ApprovalGranted,
    Event,
    KafkaEventLog,
    Message,
    ModelAnswered,
    RunFinished,
    RunStarted,
    SqliteEventLog,
    ToolCall,
)
from onward.eventlog.archive import DirectoryArchive
from onward.eventlog.archived import ArchivedEventLog
from onward.eventlog.base import EventLog, StoredEvent, partition_for
from onward.integrations.langgraph import OnwardSaver
from onward.projections.base import FrontierStore
from onward.projections.compaction import (
    CompactionStore,
    PostgresCompactionStore,
    SqliteCompactionStore,
)
from onward.projections.frontier_projection import FrontierProjection
from onward.projections.log_projector import LogProjector
from onward.projections.postgres import PostgresFrontierStore
from onward.projections.sqlite import SqliteFrontierStore
from onward.runtime import Agent, AgentRunner, RedisLeaseStore, SqliteLeaseStore
from onward.runtime.compaction import CheckpointCompactor
from onward.runtime.conversation import Conversation
from onward.runtime.gc import (
    GarbageCollector,
    KeySweeper,
    PostgresRecordSweeper,
    RecordSweeper,
    RedisKeySweeper,
    SqliteRecordSweeper,
)
from onward.runtime.leases.base import LeaseStore
from onward.runtime.providers import ModelReply, ScriptedProvider, reply
from onward.runtime.tools import tool

TENANT = "soak"
SEGMENT_BYTES = 1_048_576
"""The soak topic's segment size: small, so cut segments can be deleted soon after a cut."""
POISON = b"\x00\x01 not an event {"
"""The unreadable record written for the quarantined run."""


AGENT = Agent(name="prober", instructions="Find it.", tools=[search])


@tool(requires_approval=True)
async def pay(amount: int, note: str = "", *, idempotency_key: str) -> str:
    """A call a person must approve first."""
    return f"paid {amount}"


WAITER = Agent(name="waiter", instructions="Find it, then pay for it.", tools=[search, pay])


@dataclass
class Deployment:
    """The stores one soak runs on, and how to measure its log on disk."""

    log: EventLog
    frontiers: FrontierStore
    store: CompactionStore
    leases: LeaseStore
    inline: bool
    disk_bytes: Callable[[EventLog], Awaitable[tuple[int, int, int]]]
    """The log's bytes: kept (Kafka: in segments not wholly below the partition's start, which
    the broker deletes at its next retention check), on disk now, and of the records kept (the
    segment holding the start counted for the share of its records above the start)."""
    write_raw: Callable[[str, bytes], Awaitable[None]]
    """Write bytes under a run id as a foreign producer would, bypassing every check."""
    records: RecordSweeper
    keys: KeySweeper | None


class LongRuns:
    """``live`` long runs at a time, each ``length`` events, appended one turn per batch."""

    def __init__(self, rng: random.Random, live: int, length: int, prefix: str) -> None:
        self.rng = rng
        self.length = length
        self.prefix = prefix
        self.started = 0
        self.finished = 0
        self.runs: list[tuple[RunHistory, int]] = [self._new() for _ in range(live)]

    def _new(self) -> tuple[RunHistory, int]:
        self.started += 1
        return RunHistory(self.rng, f"{self.prefix}-{self.started}", tenant=TENANT), 0

    def next_batch(self, slot: int) -> list[Event]:
        """The next append of the run in ``slot``: its start, a turn, or its end."""
        history, iteration = self.runs[slot]
        env = history._env
        if history.seq == 0:
            self.runs[slot] = (history, iteration)
            return [RunStarted(**env(), agent="soak", revision="r1", input="go")]
        if history.seq >= self.length:
            self.finished += 1
            self.runs[slot] = self._new()
            return [RunFinished(**env(), status="completed", output="ok")]
        self.runs[slot] = (history, iteration + 1)
        return [e for step in history.turn(iteration + 1, 12) for e in step]


async def write_events(log: EventLog, runs: LongRuns, count: int, concurrency: int) -> int:
    """Append about ``count`` events, ``concurrency`` appends in flight; return how many."""
    written = 0
    slots = list(range(len(runs.runs)))

    async def writer(mine: list[int]) -> None:
        nonlocal written
        while written < count:
            for slot in mine:
                batch = runs.next_batch(slot)
                await log.append(batch)
                written += len(batch)

    await asyncio.gather(*(writer(slots[i::concurrency]) for i in range(concurrency)))
    return written


async def time_resumes(
    deployment: Deployment, projector: LogProjector, args: argparse.Namespace, round_: int
) -> list[float]:
    """Write the probes, time ``AgentRunner.resume`` of each ``--samples`` times, finish them."""
    runner = AgentRunner(
        provider=Stopwatch(),
        log=deployment.log,
        frontiers=deployment.frontiers,
        leases=deployment.leases,
        checkpoint_inline=deployment.inline,
        compaction=deployment.store,
    )
    probes = [f"probe-{round_}-{n}" for n in range(args.probes)]
    for run_id in probes:
        runner.provider = Stopwatch(args.probe_turns)
        with contextlib.suppress(FirstCall):
            await runner.run(AGENT, {"find": run_id}, tenant=TENANT, run_id=run_id)
    await projector.catch_up()
    times: list[float] = []
    for sample in range(args.warmup + args.samples):
        for run_id in probes:
            watch = Stopwatch()
            runner.provider = watch
            mark = time.perf_counter()
            with contextlib.suppress(FirstCall):
                await runner.resume(AGENT, run_id, tenant=TENANT)
            if sample >= args.warmup:
                times.append((watch.called_at - mark) * 1000.0)
            await projector.catch_up()
    runner.provider = ScriptedProvider(lambda messages: reply("found it"))
    for run_id in probes:
        await runner.resume(AGENT, run_id, tenant=TENANT)
    await projector.catch_up()
    return times


# -- waiting runs ----------------------------------------------------------------------------


class ToApproval:
    """A model that calls ``search`` ``turns`` times, then asks to ``pay`` (approval first)."""

    def __init__(self, turns: int, note: str) -> None:
        self.turns = turns
        self.note = note

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        n = sum(m.role == "assistant" for m in messages) + 1
        if n <= self.turns:
            return reply(f"looking {n}", ToolCall(call_id=f"s{n}", tool="search", args={"q": n}))
        call = ToolCall(call_id="pay", tool="pay", args={"amount": n, "note": self.note})
        return reply("paying", call)


class Recorder:
    """A model that notes the messages and the time of its first call, then ends the run."""

    def __init__(self) -> None:
        self.called_at = 0.0
        self.sent: list[Message] | None = None

    async def complete(self, agent: Agent, messages: Sequence[Message]) -> ModelReply:
        if self.sent is None:
            self.called_at = time.perf_counter()
            self.sent = list(messages)
        return reply("paid and done")


@dataclass
class Waiting:
    """The runs waiting on a person: answered a few per round, the rest at the end."""

    mid: list[str] = field(default_factory=list)
    end: list[str] = field(default_factory=list)
    over_cap: str | None = None
    setup_end: list[int] = field(default_factory=list)
    """Each partition's end once they were written: every event they wrote before their
    approval lies below it."""
    answered: int = 0
    whole: int = 0
    failures: list[str] = field(default_factory=list)


async def write_waiting(
    deployment: Deployment, args: argparse.Namespace, rounds: int
) -> tuple[Waiting, float]:
    """Write the waiting runs (and the one over the snapshot cap) before any other traffic."""
    mark = time.perf_counter()
    waiting = Waiting()
    count_end = round(args.live_runs * args.waiting_share)
    runner = _runner(deployment, ToApproval(args.waiting_turns, ""))
    ids = [f"waiting-{n}" for n in range(count_end + args.answer_per_round * rounds)]
    for run_id in ids:
        result = await runner.run(WAITER, f"find {run_id}", tenant=TENANT, run_id=run_id)
        assert result.status == "waiting", (run_id, result.status)
    waiting.mid = ids[count_end:]
    waiting.end = ids[:count_end]
    if args.over_cap:
        run_id = waiting.over_cap = "waiting-over-cap"
        # Arguments over the cap in the waiting call: the frontier holding it is refused.
        runner.provider = ToApproval(args.waiting_turns, "x" * (2 * args.snapshot_cap))
        result = await runner.run(WAITER, f"find {run_id}", tenant=TENANT, run_id=run_id)
        assert result.status == "waiting", (run_id, result.status)
        waiting.end.append(run_id)
    log = deployment.log
    waiting.setup_end = [(await log.bounds(p)).end for p in range(log.partitions)]
    return waiting, time.perf_counter() - mark


def _runner(deployment: Deployment, provider: Any) -> AgentRunner:
    return AgentRunner(
        provider=provider,
        log=deployment.log,
        frontiers=deployment.frontiers,
        leases=deployment.leases,
        checkpoint_inline=deployment.inline,
        compaction=deployment.store,
    )


async def answer(
    deployment: Deployment, archive: Path, waiting: Waiting, run_ids: list[str]
) -> list[float]:
    """Approve and resume each run; check it completed with its conversation whole. Returns
    each resume's time to the model's first call, in ms."""
    times: list[float] = []
    for run_id in run_ids:
        runner = _runner(deployment, Recorder())
        await runner.approve(run_id, "pay", tenant=TENANT, by="soak")
        recorder = Recorder()
        runner.provider = recorder
        mark = time.perf_counter()
        result = await runner.resume(WAITER, run_id, tenant=TENANT)
        times.append((recorder.called_at - mark) * 1000.0)
        waiting.answered += 1
        problem = await _conversation_problem(deployment, archive, waiting, run_id, recorder)
        if result.status != "completed":
            problem = f"status {result.status} ({result.error})"
        if problem is None:
            waiting.whole += 1
        else:
            waiting.failures.append(f"{run_id}: {problem}")
    return times


async def _conversation_problem(
    deployment: Deployment, archive: Path, waiting: Waiting, run_id: str, recorder: Recorder
) -> str | None:
    """What is wrong with the conversation the first model call after the approval was sent,
    against the run's whole history from the archive and the log; ``None``: nothing."""
    if recorder.sent is None:
        return "the model was not called after the approval"
    log = deployment.log
    partition = partition_for(run_id, log.partitions)
    archived = ArchivedEventLog(log, DirectoryArchive(archive))
    below = waiting.setup_end[partition]
    # Below the partition's end when the waiting runs were written (archive, then the log),
    # then the log: the run wrote nothing between that and its approval.
    start = max(below, (await log.bounds(partition)).start)
    history: list[StoredEvent] = [
        *await archived.read_run(run_id, end=below),
        *await log.read_run(run_id, start=start),
    ]
    events = [s.event for s in history]
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(seqs) + 1)):
        return f"its history from archive and log is not whole: seqs {seqs[:5]}...{seqs[-5:]}"
    granted = next((e.seq for e in events if isinstance(e, ApprovalGranted)), None)
    if granted is None:
        return "no approval in its history"
    answered = next(
        (e.seq for e in events if isinstance(e, ModelAnswered) and e.seq > granted), None
    )
    if answered is None:
        return "no model answer after the approval in its history"
    before = Conversation.of(WAITER.instructions, [e for e in events if e.seq < granted])
    expected = Conversation.of(WAITER.instructions, [e for e in events if e.seq < answered])
    sent = recorder.sent
    if sent[: len(before.messages)] != before.messages:
        return f"sent {len(sent)} messages, not those of its history before the approval"
    if sent != expected.messages:
        return (
            f"sent {len(sent)} messages, its history with the approval gives "
            f"{len(expected.messages)}"
        )
    return None


# -- LangGraph threads ------------------------------------------------------------------------


@dataclass
class Threads:
    """LangGraph threads growing through the soak, and what was last put on each."""

    ids: list[str]
    last: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    puts: int = 0


def _saver(deployment: Deployment) -> OnwardSaver:
    return OnwardSaver(
        deployment.log,
        deployment.leases,
        tenant=TENANT,
        frontiers=deployment.frontiers,
        checkpoint_inline=deployment.inline,
        compaction=deployment.store,
    )


async def grow_threads(saver: OnwardSaver, threads: Threads, puts: int, round_: int) -> None:
    """Put ``puts`` more checkpoints on each thread, each its parent's child."""
    from langgraph.checkpoint.base import empty_checkpoint  # noqa: PLC0415

    for thread_id in threads.ids:
        for n in range(puts):
            step = threads.puts // len(threads.ids) + n + 1
            checkpoint: Any = empty_checkpoint()
            value = {"round": round_, "step": step, "note": f"{thread_id} step {step} " * 8}
            checkpoint["channel_values"] = {"state": value}
            checkpoint["channel_versions"] = {"state": step}
            configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
            parent = threads.last.get(thread_id)
            if parent is not None:
                configurable["checkpoint_id"] = parent[0]
            metadata: Any = {"source": "loop", "step": step, "parents": {}}
            await saver.aput({"configurable": configurable}, checkpoint, metadata, {"state": step})
            threads.last[thread_id] = (checkpoint["id"], value)
    threads.puts += puts * len(threads.ids)


async def load_threads(deployment: Deployment, threads: Threads) -> tuple[list[float], int]:
    """A fresh saver loads each thread's latest checkpoint (timed, in ms); how many are the
    last ones put."""
    times: list[float] = []
    latest = 0
    async with _saver(deployment) as reader:
        for thread_id in threads.ids:
            config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
            mark = time.perf_counter()
            loaded = await reader.aget_tuple(config)
            times.append((time.perf_counter() - mark) * 1000.0)
            want = threads.last.get(thread_id)
            if (
                loaded is not None
                and want is not None
                and loaded.checkpoint["id"] == want[0]
                and loaded.checkpoint["channel_values"].get("state") == want[1]
            ):
                latest += 1
    return times, latest


# -- quarantine -------------------------------------------------------------------------------


async def write_quarantined(deployment: Deployment, rng: random.Random) -> tuple[str, int]:
    """A run of a few turns, then an unreadable record of it; returns its id and event count."""
    history = RunHistory(rng, "quarantined-1", tenant=TENANT)
    log = deployment.log
    await log.append([RunStarted(**history._env(), agent="soak", revision="r1", input="go")])
    for iteration in range(1, 4):
        for step in history.turn(iteration, 12):
            await log.append(step)
    await deployment.write_raw(history.run_id, POISON)
    return history.run_id, history.seq


async def check_quarantined(deployment: Deployment, run_id: str, events: int) -> dict[str, Any]:
    """The quarantined run: set aside, kept whole by compaction, every event readable."""
    row = await deployment.frontiers.get(run_id)
    point = (await deployment.store.truncations([run_id])).get(run_id)
    # What compaction kept of it below the log's start, then the log (its unreadable record
    # left out): what a projector folding it again reads.
    log = deployment.log
    partition = partition_for(run_id, log.partitions)
    start = (await log.bounds(partition)).start
    kept = [e.stored() for e in await deployment.store.retained(run_id) if e.offset < start]
    records = await log.read_records(partition, start, run_id=run_id)
    read = [*kept, *(r for r in records if isinstance(r, StoredEvent))]
    seqs = [s.event.seq for s in read]
    return {
        "run_id": run_id,
        "quarantined": row is not None and row.quarantined is not None,
        "compacted": point is not None,
        "kept_whole": point is not None and point.whole,
        "events_written": events,
        "events_read": len(read),
        "unreadable_in_log": len(records) - (len(read) - len(kept)),
        "met": row is not None
        and row.quarantined is not None
        and seqs == list(range(1, events + 1)),
    }


# -- the soak ---------------------------------------------------------------------------------


async def soak(
    deployment: Deployment, archive: Path, args: argparse.Namespace, console: Console
) -> dict[str, Any]:
    log = deployment.log
    # As `onward projector` does: a frontier over the cap is kept uncapped beside the row.
    projection = FrontierProjection(
        deployment.frontiers, log, max_bytes=args.snapshot_cap, compaction=deployment.store
    )
    projector = LogProjector(log, projection)
    compactor = CheckpointCompactor(
        log,
        deployment.frontiers,
        deployment.store,
        archive=DirectoryArchive(archive),
        max_checkpoints=args.max_checkpoints,
    )
    collector = GarbageCollector(deployment.records, deployment.keys)
    rounds = -(-args.events // args.compact_every)
    rng = random.Random(args.seed)
    waiting, setup_s = await write_waiting(deployment, args, rounds)
    console.print(
        f"{len(waiting.mid) + len(waiting.end)} waiting runs written in {setup_s:.1f}s "
        f"({len(waiting.end)} answered at the end, {args.answer_per_round} a round before)"
    )
    threads = Threads([f"thread-{n}" for n in range(args.threads)])
    writer = _saver(deployment)
    runs = LongRuns(rng, args.live_runs, args.run_length, "long")
    timeline: list[dict[str, Any]] = []
    written = cut = archived = collected = 0
    quarantined: tuple[str, int] | None = None
    started = time.perf_counter()
    async with writer:
        for round_ in range(1, rounds + 1):
            mark = time.perf_counter()
            written += await write_events(log, runs, args.compact_every, args.concurrency)
            if threads.ids:
                await grow_threads(writer, threads, args.thread_puts, round_)
            if args.quarantine and round_ == rounds:
                quarantined = await write_quarantined(deployment, rng)
            write_s = time.perf_counter() - mark
            mark = time.perf_counter()
            await projector.catch_up()
            fold_s = time.perf_counter() - mark
            gc_s = 0.0
            if args.gc_every and round_ % args.gc_every == 0:
                mark = time.perf_counter()
                collected += len((await collector.run()).expired)
                gc_s = time.perf_counter() - mark
            mark = time.perf_counter()
            report = await compactor.compact()
            compact_s = time.perf_counter() - mark
            cut += report.events_cut
            archived += report.archived
            resumes = await time_resumes(deployment, projector, args, round_)
            share = args.answer_per_round
            answers = await answer(
                deployment, archive, waiting, waiting.mid[(round_ - 1) * share : round_ * share]
            )
            await projector.catch_up()
            loads, latest = await load_threads(deployment, threads) if threads.ids else ([], 0)
            bounds = [await log.bounds(p) for p in range(log.partitions)]
            kept_bytes, disk_bytes, record_bytes = await deployment.disk_bytes(log)
            in_archive = sum(r.events for r in await DirectoryArchive(archive).ranges())
            row: dict[str, Any] = {
                "events_written": written,
                "log_records": sum(b.end - b.start for b in bounds),
                "log_bytes": kept_bytes,
                "log_record_bytes": record_bytes,
                "log_bytes_on_disk": disk_bytes,
                "resume_p50_ms": _common.quantile(resumes, 0.5),
                "resume_p99_ms": _common.quantile(resumes, 0.99),
                "resume_samples_ms": resumes,
                "waiting_resume_p50_ms": _common.quantile(answers, 0.5) if answers else None,
                "waiting_answered": len(answers),
                "waiting_samples_ms": answers,
                "thread_load_p50_ms": _common.quantile(loads, 0.5) if loads else None,
                "threads_latest": latest,
                "thread_checkpoints": threads.puts // max(1, len(threads.ids)),
                "records_cut": cut,
                "records_archived": archived,
                "archive_records": in_archive,
                "archive_complete": in_archive == cut,
                "runs_finished": runs.finished,
                "runs_collected": collected,
                "held_by": sorted({p.held_by for p in report.partitions}),
                "snapshots_refused": projection.stats.snapshots_refused,
                "write_s": write_s,
                "fold_s": fold_s,
                "gc_s": gc_s,
                "compact_s": compact_s,
                "elapsed_s": time.perf_counter() - started,
            }
            timeline.append(row)
            console.print(
                f"{written:>9,} written: log {row['log_records']:>7,} records, "
                f"{record_bytes / 1e6:6.2f} MB ({kept_bytes / 1e6:5.1f} MB in segments, "
                f"{disk_bytes / 1e6:6.1f} on disk); resume p50 {row['resume_p50_ms']:6.2f} ms, "
                f"waiting {_ms(row['waiting_resume_p50_ms'])}, thread load "
                f"{_ms(row['thread_load_p50_ms'])} ({latest}/{len(threads.ids)} latest); "
                f"cut {cut:,}, archive {in_archive:,}; collected {collected:,}; "
                f"write {write_s:.1f}s fold {fold_s:.1f}s gc {gc_s:.1f}s compact {compact_s:.1f}s"
            )
    mark = time.perf_counter()
    final = await answer(deployment, archive, waiting, waiting.end)
    answer_s = time.perf_counter() - mark
    over_cap: dict[str, Any] | None = None
    if waiting.over_cap is not None:
        point = (await deployment.store.truncations([waiting.over_cap])).get(waiting.over_cap)
        over_cap = {
            "run_id": waiting.over_cap,
            "compacted": point is not None,
            "kept_whole": point is not None and point.whole,
            "kept_uncapped": bool(await deployment.store.snapshots([waiting.over_cap])),
            "completed_whole": not any(
                f.startswith(f"{waiting.over_cap}:") for f in waiting.failures
            ),
        }
        over_cap["met"] = over_cap["completed_whole"] and over_cap["compacted"]
    ranges = await DirectoryArchive(archive).ranges()
    in_archive = sum(r.events for r in ranges)
    starts = sum([(await log.bounds(p)).start for p in range(log.partitions)])
    return {
        "timeline": timeline,
        "waiting": {
            "runs": len(waiting.mid) + len(waiting.end),
            "answered": waiting.answered,
            "completed_whole": waiting.whole,
            "answered_at_end": len(waiting.end),
            "end_resume_p50_ms": _common.quantile(final, 0.5) if final else None,
            "answer_s": answer_s,
            "failures": waiting.failures,
        },
        "over_cap": over_cap,
        "threads": {
            "threads": len(threads.ids),
            "checkpoints_each": threads.puts // max(1, len(threads.ids)),
            "latest_at_end": timeline[-1]["threads_latest"] if timeline else 0,
        },
        "quarantined": await check_quarantined(deployment, *quarantined)
        if quarantined is not None
        else None,
        "gc": {"runs_collected": collected},
        "archive": {
            "records": in_archive,
            "records_cut": cut,
            "partition_starts": starts,
            "files": len(ranges),
            "bytes": sum(r.size for r in ranges),
            "complete": in_archive == cut == starts,
        },
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


@asynccontextmanager
async def kafka_deployment(args: argparse.Namespace, console: Console) -> AsyncIterator[Deployment]:
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415
    from aiokafka.admin.config_resource import (  # noqa: PLC0415
        ConfigResource,
        ConfigResourceType,
    )

    topic = _common.throwaway_name("soak")
    prefix = f"onward-bench-soak-{topic.rsplit('.', 1)[1]}:"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    schema: str | None = None
    try:
        configs = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "segment.bytes": str(SEGMENT_BYTES),
        }
        await admin.create_topics([NewTopic(topic, args.partitions, 1, topic_configs=configs)])
        # The broker on this machine: where it keeps the topic's partition folders.
        (found,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, "1", {"log.dirs": None})]
        )
        entries = found.resources[0][4]
        log_dir = Path(next(e[1] for e in entries if e[0] == "log.dirs").split(",")[0])

        async def disk_bytes(log: EventLog) -> tuple[int, int, int]:
            bounds = [await log.bounds(p) for p in range(args.partitions)]

            def walk() -> tuple[int, int, int]:
                kept = total = records = 0
                for p, bound in enumerate(bounds):
                    segments = sorted(
                        (int(f.stem), f.stat().st_size)
                        for f in (log_dir / f"{topic}-{p}").glob("*.log")
                    )
                    for (base, size), after in zip(segments, [*segments[1:], None], strict=True):
                        total += size
                        # Kept at the broker's next retention check: the next segment starts
                        # above the partition's start, or this is the last one.
                        following = bound.end if after is None else after[0]
                        if after is None or following > bound.start:
                            kept += size
                            # Of the segment holding the start, the share of its records above.
                            span = max(1, following - base)
                            share = min(1.0, (following - max(base, bound.start)) / span)
                            records += int(size * share)
                return kept, total, records

            return await asyncio.to_thread(walk)

        async def write_raw(run_id: str, record: bytes) -> None:
            producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all")
            await producer.start()
            try:
                partition = partition_for(run_id, args.partitions)
                await producer.send_and_wait(
                    topic, record, key=run_id.encode(), partition=partition
                )
            finally:
                await producer.stop()

        schema = await _common.create_schema(args.database_url, "soak")
        async with (
            KafkaEventLog(
                args.bootstrap, topic=topic, partitions=args.partitions, create_topic=False
            ) as log,
            PostgresFrontierStore(args.database_url, schema=schema) as frontiers,
            PostgresCompactionStore(args.database_url, schema=schema) as store,
            RedisLeaseStore(args.redis_url, prefix=prefix) as leases,
            PostgresRecordSweeper(args.database_url, schema=schema) as records,
            RedisKeySweeper(
                args.redis_url, prefix=prefix, schema_prefix=f"{prefix}mcp:schema:"
            ) as keys,
        ):
            yield Deployment(
                log, frontiers, store, leases, False, disk_bytes, write_raw, records, keys
            )
    finally:
        await admin.close()
        await _common.delete_topics(args.bootstrap, [topic], console)
        if schema is not None:
            await _common.drop_schemas(args.database_url, [schema], console)
        await _common.delete_redis_keys(args.redis_url, prefix, console)


@asynccontextmanager
async def sqlite_deployment(folder: Path, args: argparse.Namespace) -> AsyncIterator[Deployment]:
    path = folder / "onward.db"
    async with (
        SqliteEventLog(path, partitions=args.partitions) as log,
        SqliteFrontierStore(path) as frontiers,
        SqliteCompactionStore(path, sharing=log) as store,
        SqliteLeaseStore(path) as leases,
        SqliteRecordSweeper(path) as records,
    ):

        async def disk_bytes(log: EventLog) -> tuple[int, int, int]:
            import sqlite3  # noqa: PLC0415

            def pages() -> tuple[int, int, int]:
                # The log's own table and index, not the frontier rows and transcript beside
                # them in the file (the garbage collector's to remove).
                conn = sqlite3.connect(path)
                try:
                    (used,) = conn.execute(
                        "SELECT coalesce(sum(pgsize), 0) FROM dbstat "
                        "WHERE name IN ('onward_log', 'onward_log_by_run')"
                    ).fetchone()
                finally:
                    conn.close()
                return int(used), int(used), int(used)

            return await asyncio.to_thread(pages)

        async def write_raw(run_id: str, record: bytes) -> None:
            assert isinstance(log, SqliteEventLog)
            log.write_raw(run_id, record)

        yield Deployment(log, frontiers, store, leases, True, disk_bytes, write_raw, records, None)


def _table(result: dict[str, Any]) -> Table:
    table = Table(title="soak: log size and resume over time", title_justify="left")
    columns = (
        "events written",
        "log records",
        "record MB",
        "segment MB",
        "disk MB",
        "resume p50 ms",
        "waiting p50 ms",
        "thread p50 ms",
        "threads latest",
        "cut",
        "archive",
        "collected",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for row in result["timeline"]:
        table.add_row(
            f"{row['events_written']:,}",
            f"{row['log_records']:,}",
            f"{row['log_record_bytes'] / 1e6:.2f}",
            f"{row['log_bytes'] / 1e6:.1f}",
            f"{row['log_bytes_on_disk'] / 1e6:.1f}",
            f"{row['resume_p50_ms']:.2f}",
            _ms(row["waiting_resume_p50_ms"]).removesuffix(" ms"),
            _ms(row["thread_load_p50_ms"]).removesuffix(" ms"),
            f"{row['threads_latest']}",
            f"{row['records_cut']:,}",
            f"{row['archive_records']:,}",
            f"{row['runs_collected']:,}",
        )
    return table


def targets(result: dict[str, Any], warmup_rounds: int) -> dict[str, Any]:
    """The issue's checks on a soak's timeline."""
    rows = result["timeline"]
    base = rows[min(warmup_rounds, len(rows) - 1)]
    last = rows[-1]
    # The start and the end: the resume samples of the first and of the last three rounds, so
    # one noisy round (a shared machine, the broker's retention check) does not decide it alone.
    ends = min(3, len(rows) // 2) or 1
    first = _common.quantile([t for r in rows[:ends] for t in r["resume_samples_ms"]], 0.5)
    end = _common.quantile([t for r in rows[-ends:] for t in r["resume_samples_ms"]], 0.5)
    waiting = result["waiting"]
    checks: dict[str, Any] = {
        "log_plateaus": {
            "after_warmup_round": rows.index(base) + 1,
            "records_first": base["log_records"],
            "records_last": last["log_records"],
            "record_bytes_first": base["log_record_bytes"],
            "record_bytes_last": last["log_record_bytes"],
            "records_max_after_warmup": max(r["log_records"] for r in rows[rows.index(base) :]),
            "events_written": last["events_written"],
            "met": last["log_records"] <= 1.5 * max(1, base["log_records"])
            and last["log_record_bytes"] <= 1.5 * max(1, base["log_record_bytes"])
            and last["log_records"] < last["events_written"] / 4,
        },
        "resume_p50_end_over_start": {
            "rounds_pooled": ends,
            "start_ms": first,
            "end_ms": end,
            "ratio": end / first,
            "first_to_last_round_ratio": last["resume_p50_ms"] / rows[0]["resume_p50_ms"],
            "met": end / first <= 1.2,
        },
        "archive_complete": {
            "rounds_complete": sum(bool(r["archive_complete"]) for r in rows),
            "rounds": len(rows),
            "met": bool(result["archive"]["complete"]) and all(r["archive_complete"] for r in rows),
        },
        "waiting_runs_complete_whole": {
            "answered": waiting["answered"],
            "completed_whole": waiting["completed_whole"],
            "met": waiting["answered"] == waiting["runs"] == waiting["completed_whole"],
        },
    }
    if result["threads"]["threads"]:
        checks["threads_load_latest"] = {
            "latest": result["threads"]["latest_at_end"],
            "threads": result["threads"]["threads"],
            "every_round": all(r["threads_latest"] == result["threads"]["threads"] for r in rows),
            "met": all(r["threads_latest"] == result["threads"]["threads"] for r in rows),
        }
    if result["over_cap"] is not None:
        checks["over_cap_resumes"] = result["over_cap"]
    if result["quarantined"] is not None:
        checks["quarantined_kept_whole"] = result["quarantined"]
    return checks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=["kafka", "sqlite"], default="kafka")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--compact-every", type=int, default=50_000)
    parser.add_argument("--max-checkpoints", type=int, default=50)
    parser.add_argument("--live-runs", type=int, default=200)
    parser.add_argument("--run-length", type=int, default=2_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--probes", type=int, default=3)
    parser.add_argument("--probe-turns", type=int, default=20)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--warmup-rounds", type=int, default=1, help="rounds before the plateau's first round"
    )
    parser.add_argument(
        "--waiting-share",
        type=float,
        default=0.1,
        help="waiting runs answered at the end, as a share of --live-runs (0: none)",
    )
    parser.add_argument(
        "--answer-per-round", type=int, default=3, help="waiting runs answered each round"
    )
    parser.add_argument("--waiting-turns", type=int, default=6)
    parser.add_argument("--threads", type=int, default=4, help="LangGraph threads (0: none)")
    parser.add_argument("--thread-puts", type=int, default=10, help="checkpoints per round")
    parser.add_argument("--gc-every", type=int, default=2, help="rounds between GC (0: none)")
    parser.add_argument("--quarantine", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--over-cap", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--snapshot-cap", type=int, default=65_536, help="the projector's max_bytes"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=Path("bench/results/soak.json"))
    _common.add_server_options(parser, "bootstrap", "database_url", "redis_url")
    return parser


async def bench(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="onward-bench-soak-"))
    try:
        if args.backend == "kafka":
            async with kafka_deployment(args, console) as deployment:
                return await soak(deployment, folder / "archive", args, console)
        async with sqlite_deployment(folder, args) as deployment:
            return await soak(deployment, folder / "archive", args, console)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    args = _parser().parse_args()
    if args.backend == "kafka":
        _common.server_urls(args, "bootstrap", "database_url", "redis_url")
    console = Console(width=200)
    code = _common.code_version()
    load_before = os.getloadavg()
    console.print(f"code at {code}; load average {load_before[0]:.2f} on {os.cpu_count()} CPUs")
    result = _common.run_ending_on_sigterm(bench(args, console))
    console.print(_table(result))
    checks = targets(result, args.warmup_rounds)
    for check, outcome in checks.items():
        verdict = "[green]met" if outcome["met"] else "[red]not met"
        console.print(f"target {check}: {outcome} {verdict}")
    for failure in result["waiting"]["failures"][:10]:
        console.print(f"[red]waiting run: {failure}")
    parameters = {
        k: v for k, v in vars(args).items() if k not in {"database_url", "redis_url", "bootstrap"}
    }
    _common.write_results(
        args.json,
        {
            "benchmark": "soak",
            "code": code,
            "machine": {"cpus": os.cpu_count(), "load_average_before": load_before},
            "parameters": parameters | {"json": str(args.json)},
            "targets": checks,
            "results": result,
        },
    )


if __name__ == "__main__":
    main()
