"""Throughput: weir's GroupConsumer in each ordering mode against a raw confluent-kafka loop.

    python benchmarks/throughput.py [--quick] [--json out.json] [--bootstrap HOST:PORT]

Cases, each on a fresh consumer group over records produced before the clock starts:

* noop:  no-op handler; raw serial loop (best of ``--raw-repeats``) vs GroupConsumer key /
         partition / unordered; and a no-op batch handler (``batch-<mode>``: ``handle_batch``
         touching each record, ``--batch-records`` a batch) in ``--batch-modes``;
* io:    1 ms I/O handler (``time.sleep(0.001)``, the kernel's timer slack turned off for the
         handler's thread: see ``_common.precise_timers``) on ``--workers`` threads, compared with
         the ideal ``workers / 1 ms`` and with the raw serial loop (~1000/s, so it runs on a
         sample);
* io-1p: 1 ms I/O, key mode, one partition holding 100 keys.
* io-hot: 1 ms I/O, key mode, one key per partition (``--partitions`` of them): parallelism has
         to come from partitions, so the budget must be shared between them (no issue target;
         a guard for the few-keys case).
* failures: 1 ms I/O, key mode, ``--fail-percent`` (1 %) of the records failing once and
         retried after a short backoff (``--fail-backoff-ms``), against the same run with no
         failures, alternating (``--failure-repeats`` pairs, default flow only); the target is
         0.9x of the no-failure rate. ``--failure-records`` (120k) per run: a run ends with the
         last retries' backoff and their keys' waiting records, a fixed 0.1-0.2 s that would
         weigh 4-7 % in a 3 s run of the io case's 40k.
* aio, aio-tail: asyncio handlers (``await asyncio.sleep``) on the same topic as ``io``'s shape:
         uniform 1 ms, and a tail mix (1 % of the records 100 ms, the rest 1 ms). Engines: a plain
         aiokafka loop as an asyncio user writes it today (``getmany``, ``asyncio.gather`` over
         the batch, ``commit``), GroupConsumer with the async handler (``async-<mode>``,
         ``--max-in-flight``) and GroupConsumer with the same waits on ``--workers`` threads.
         Repeated ``--aio-repeats`` times, interleaved. The no-op case also runs an async no-op
         handler (``async-key``).
* tracing: no-op and 1 ms handlers, key mode, tracing off (the default: nothing is wrapped) and on
         (``tracer_provider=``: an OpenTelemetry SDK provider whose batch span processor hands
         the spans to an exporter that drops them, so the cost is weir's and the SDK's, not an
         export's), interleaved ``--tracing-repeats`` times; the ratio on/off of the medians.
* eos:   input -> transform -> output in key mode, no-op and 1 ms handlers, side by side in one
         run: at-least-once without output (``alo``), at-least-once producing each output from
         the handler with a shared idempotent producer (``alo+out``: not awaited before the
         commit, the usual at-least-once pipeline), and the transactional mode
         (``eos``: ``ctx.produce``, ``transactional_id``) with the default 0.1 s transaction
         interval and with 1 s (``eos-1s``). Besides the handler-side rate, the rate up to the
         group's last commit (``rec/s to commit``: for ``eos`` the outputs are visible then).

Every GroupConsumer case runs with two flow budgets: weir's defaults, and "wide" (a record budget
large enough to cover the ~1 s librdkafka needs to restart fetching after a resume; see
README.md). The rate is measured from the first record entering a handler to the last one leaving
it (group join excluded); the rate including start-up and group join is reported too. A run is
cut at ``--max-seconds``; its rate then counts the records finished so far. Broker, producer and
consumer share this machine's cores, so absolute figures are lower than on separate hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import os
import statistics
import sys
import threading
import time
import zlib
from collections.abc import Callable
from gc import callbacks as gc_callbacks
from typing import Any

from _common import (
    LOG_EVENTS,
    Broker,
    CpuWatch,
    Meter,
    add_broker_args,
    async_noop_handler,
    async_sleep_handler,
    broker_from,
    create_topic,
    delete_topics,
    environment,
    fmt_rate,
    noop_handler,
    precise_timers,
    produce,
    quiet_logging,
    sleep_handler,
    table,
    tail_handler,
    thread_summary,
    unique,
    write_json,
)
from confluent_kafka import Consumer
from typing_extensions import TypedDict

from weir import (
    BatchContext,
    BatchHandler,
    CommitEvent,
    ConsumerConfig,
    Context,
    FailurePolicy,
    FlowConfig,
    GroupConsumer,
    Handler,
    Record,
    RetryPolicy,
)
from weir.records import Ordering

# Targets from the issue.
NOOP_TARGET = 0.30  # of the raw loop
BATCH_TARGET = 0.60  # a no-op batch handler (batches of 500), of the raw loop
IO_TARGET = 0.90  # of the ideal workers / handler time
FAILURES_TARGET = 0.90  # of the same run without failures
AIO_TARGET = 1.0  # async key mode, of the aiokafka + gather loop, uniform 1 ms
AIO_TAIL_TARGET = 5.0  # the same on the tail mix

FLOWS: dict[str, FlowConfig] = {
    "default": FlowConfig(),
    # Pause only when 40k records are in flight and resume at 20k: at ~15k/s that leaves > 1 s of
    # work queued while librdkafka restarts fetching. Small records: the byte marks (64/32 MiB)
    # stay as they are and still bound memory.
    "wide": FlowConfig(capacity_records=50_000, pause_records=40_000, resume_records=20_000),
    "x4": FlowConfig(capacity_records=4_800, pause_records=4_000, resume_records=1_600),
}

# A handler function: gets a weir Record, or a confluent_kafka Message in the raw loop.
HandlerFn = Callable[[Any], None]

ORDERINGS: dict[str, Ordering] = {"key": "key", "partition": "partition", "unordered": "unordered"}


class Tuning(TypedDict, total=False):
    """GroupConsumer settings given on the command line."""

    max_batch_records: int
    commit_every_records: int
    failure: FailurePolicy
    max_in_flight: int
    workers: int
    batch_max_records: int
    flow: FlowConfig


# The raw loop fetches like weir does. With librdkafka's defaults (fetch.wait.max.ms=500,
# fetch.queue.backoff.ms=1000) it was bimodal here: runs at ~150k/s stalled on fetches (0.25 cores
# busy) next to runs at 600k-930k/s. With these two settings every run is fast, so "x raw"
# compares the engines, not fetch stalls. `--raw-librdkafka-defaults` runs it without them.
# (queued.min.messages is weir's value and the client default alike.)
RAW_FETCH: dict[str, Any] = {
    name: ConsumerConfig(bootstrap_servers="x", group_id="x", topics=["x"]).librdkafka_config()[
        name
    ]
    for name in ("fetch.wait.max.ms", "fetch.queue.backoff.ms")
}
# weir's commit cadence, which the raw loop copies.
DEFAULTS: dict[str, Any] = {
    name: ConsumerConfig.model_fields[name].default
    for name in ("commit_every_records", "commit_interval_s")
}


@dataclasses.dataclass
class Topic:
    name: str
    records: int
    partitions: int
    keys: int


@dataclasses.dataclass
class Result:
    case: str
    engine: str  # "raw" or the ordering mode
    flow: str  # "-" for raw
    handler: str
    topic: str
    partitions: int
    keys: int
    records: int  # finished within the run (all of them unless cut)
    seconds: float  # first record in a handler -> last record out
    total_seconds: float  # start() (or subscribe) -> last record out
    join_seconds: float  # start() -> first record in a handler
    rate: float
    rate_total: float
    cpu: dict[str, float | None]
    cut: bool = False
    ideal: float | None = None
    vs_raw: float | None = None
    vs_ideal: float | None = None
    target: str = ""
    met: bool | None = None
    throttles: int | None = None
    peak_in_flight: int | None = None
    rebalances: int | None = None
    retries: int | None = None
    vs_no_failures: float | None = None
    seconds_to_commit: float | None = None  # first record in a handler -> the last commit
    rate_to_commit: float | None = None
    load: float | None = None  # the 1-minute load average at the start
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)


class _GcTime:
    """CPU time of Python's cyclic garbage collector, per generation, in this process: a
    callback around each collection reads the collecting thread's CPU clock (the collector
    holds the interpreter lock, so wall time would count other processes' turns too)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._began: dict[int, float] = {}
        gc_callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began[threading.get_ident()] = time.thread_time()
            return
        began = self._began.pop(threading.get_ident(), None)
        if began is not None:
            g = info["generation"]
            self.seconds[g] += time.thread_time() - began
            self.count[g] += 1

    def snapshot(self) -> tuple[list[float], list[int]]:
        return list(self.seconds), list(self.count)


_GC = _GcTime()


class Watch(CpuWatch):
    """`CpuWatch`, and the collector's CPU seconds and collections per generation over the run
    (`gc_s`, `gc_young`, `gc_middle`, `gc_full`): with fast handlers the collector's walks over
    records in flight were a large part of weir's cost (benchmarks/README.md)."""

    def start(self) -> None:
        self._gc0 = _GC.snapshot()
        super().start()

    def stop(self) -> dict[str, float | None]:
        out = super().stop()
        (s0, c0), (s1, c1) = self._gc0, _GC.snapshot()
        out["gc_s"] = sum(s1) - sum(s0)
        for name, g in (("gc_young", 0), ("gc_middle", 1), ("gc_full", 2)):
            out[name] = float(c1[g] - c0[g])
        return out


def _result(
    case: str,
    engine: str,
    flow: str,
    handler: str,
    topic: Topic,
    meter: Meter,
    started: float,
    cut_at: float | None,
    cpu: dict[str, float | None],
    settings: dict[str, Any],
) -> Result:
    if meter.last is not None:
        end, n = meter.last, meter.target
    else:
        end, n = (cut_at if cut_at is not None else time.perf_counter()), meter.n
    first = meter.first if meter.first is not None else end
    seconds = max(end - first, 1e-9)
    return Result(
        case=case,
        engine=engine,
        flow=flow,
        handler=handler,
        topic=topic.name,
        partitions=topic.partitions,
        keys=topic.keys,
        records=n,
        seconds=seconds,
        total_seconds=end - started,
        join_seconds=first - started,
        rate=n / seconds,
        rate_total=n / max(end - started, 1e-9),
        cpu=cpu,
        cut=meter.last is None,
        settings=settings,
    )


def run_raw(
    bk: Broker,
    topic: Topic,
    records: int,
    handle: Callable[[Meter], HandlerFn],
    *,
    case: str,
    handler_name: str,
    batch: int,
    max_seconds: float,
    fetch: dict[str, Any],
    commit_every_records: int = DEFAULTS["commit_every_records"],
    commit_interval_s: float = DEFAULTS["commit_interval_s"],
) -> Result:
    """The baseline: one thread, `consume()` a batch, handle each record inline, commit async
    every `commit_every_records` records or `commit_interval_s` seconds (weir's cadence: its
    defaults unless given). librdkafka defaults apart from `fetch`."""
    meter = Meter(records)
    h = handle(meter)
    watch = Watch(bk)
    started = time.perf_counter()
    c = Consumer(
        {
            "bootstrap.servers": bk.bootstrap,
            "group.id": unique("bench-raw"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **fetch,
        }
    )
    c.subscribe([topic.name])
    deadline = started + max_seconds
    since_commit = 0
    last_commit = time.monotonic()
    done = meter.done
    try:
        while not done.is_set() and time.perf_counter() < deadline:
            msgs = c.consume(batch, 0.1)
            for m in msgs:
                if m.error() is not None:
                    continue
                h(m)
                if done.is_set():
                    break
            since_commit += len(msgs)
            now = time.monotonic()
            if since_commit and (
                since_commit >= commit_every_records or now - last_commit >= commit_interval_s
            ):
                c.commit(asynchronous=True)
                since_commit = 0
                last_commit = now
        cut_at = None if done.is_set() else time.perf_counter()
        cpu = watch.stop()
    finally:
        c.close()
    return _result(
        case,
        "raw",
        "-",
        handler_name,
        topic,
        meter,
        started,
        cut_at,
        cpu,
        {
            "consume_batch": batch,
            "commit_every_records": commit_every_records,
            "commit_interval_s": commit_interval_s,
            **fetch,
        },
    )


def run_aiokafka(
    bk: Broker,
    topic: Topic,
    records: int,
    handle: Callable[[Meter], Callable[[Any], Any]],
    *,
    case: str,
    handler_name: str,
    max_seconds: float,
    max_records: int | None = None,
) -> Result:
    """The asyncio peer, as an asyncio user writes it today with aiokafka: `getmany()` what is
    fetched (at most `max_records`), `asyncio.gather` the handler over the whole batch,
    `commit()` the positions, again. A batch is finished before the next is fetched, so it waits
    for its slowest record."""
    try:
        from aiokafka import AIOKafkaConsumer
    except ImportError:
        raise SystemExit(
            "the aiokafka peer needs the bench extra: pip install -e '.[bench]' (make bench "
            "installs it), or leave it out with --aio-engines async-key,key"
        ) from None

    meter = Meter(records)
    h = handle(meter)
    watch = Watch(bk)
    started = time.perf_counter()

    sizes: list[int] = []

    async def main() -> tuple[float | None, dict[str, float | None]]:
        c = AIOKafkaConsumer(
            topic.name,
            bootstrap_servers=bk.bootstrap,
            group_id=unique("bench-aiokafka"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        try:
            deadline = started + max_seconds
            while not meter.done.is_set() and time.perf_counter() < deadline:
                batch = await c.getmany(timeout_ms=100, max_records=max_records)
                msgs = [m for part in batch.values() for m in part]
                if msgs:
                    sizes.append(len(msgs))
                    await asyncio.gather(*(h(m) for m in msgs))
                    await c.commit()
            cut = None if meter.done.is_set() else time.perf_counter()
            return cut, watch.stop()
        finally:
            await c.stop()

    cut_at, cpu = asyncio.run(main())
    # How many records each getmany() returned: a batch waits for its slowest record, so the
    # tail mix costs the peer one slow wait per batch.
    batches = {"batches": len(sizes), "batch_mean": round(statistics.mean(sizes)) if sizes else 0}
    batches["batch_max"] = max(sizes, default=0)
    engine = "aiokafka" if max_records is None else f"aiokafka:{max_records}"
    return _result(case, engine, "-", handler_name, topic, meter, started, cut_at, cpu, batches)


def run_weir(
    bk: Broker,
    topic: Topic,
    records: int,
    handle: Callable[[Meter], Any],
    *,
    case: str,
    handler_name: str,
    ordering: Ordering,
    flow: str,
    workers: int,
    max_seconds: float,
    settings: Tuning,
    tracer_provider: Any = None,
) -> Result:
    meter = Meter(records)
    h = handle(meter)
    tuning: Tuning = {**settings}
    if not inspect.iscoroutinefunction(h):
        # Threads only: async handlers have max_in_flight (in `settings`) instead.
        tuning["workers"] = workers
    if flow != "default":
        # "default": weir's own default, which for async handlers scales with max_in_flight.
        tuning["flow"] = FLOWS[flow]
    gc = GroupConsumer(
        h,
        bootstrap_servers=bk.bootstrap,
        group_id=unique("bench-weir"),
        topics=[topic.name],
        ordering=ordering,
        tracer_provider=tracer_provider,
        **tuning,
    )
    watch = Watch(bk)
    started = time.perf_counter()
    gc.start()
    try:
        finished = meter.done.wait(max_seconds)
        cut_at = None if finished else time.perf_counter()
        cpu = watch.stop()
    finally:
        gc.stop()
        gc.join(60)
    result = _result(
        case,
        ordering,
        flow,
        handler_name,
        topic,
        meter,
        started,
        cut_at,
        cpu,
        {"workers": workers, "flow": gc.config.flow.model_dump(), **settings},
    )
    st = gc.stats()
    result.throttles = st.throttles
    result.peak_in_flight = st.peak_in_flight
    result.rebalances = st.rebalances
    result.retries = st.retries
    return result


class NoopBatch(BatchHandler):
    """The no-op batch handler: touches each record once, as the raw loop's no-op handler
    does (one meter tick per record)."""

    def __init__(self, meter: Meter) -> None:
        self._begin, self._end = meter.begin, meter.end

    def handle_batch(self, records: list[Record], ctx: BatchContext) -> None:
        self._begin()
        end = self._end
        for _ in records:
            end()


class FailingIO(Handler):
    """The 1 ms I/O handler whose first attempt fails for a fixed `percent` of the records
    (chosen by a hash of partition and offset, the same in every run). A failed attempt costs
    its 1 ms too, as a call to a service that answered with an error would."""

    def __init__(
        self, meter: Meter, seconds: float, percent: float, *, precise: bool = True
    ) -> None:
        self._begin, self._end, self._seconds = meter.begin, meter.end, seconds
        self._threshold = round(percent * 100)  # of 10,000
        self._precise = precise
        self.failed = 0  # attempts that failed (approximate under threads; a count for the log)

    def fails(self, record: Record) -> bool:
        key = b"%d/%d" % (record.partition, record.offset)
        return zlib.crc32(key) % 10_000 < self._threshold

    def handle(self, record: Record, ctx: Context) -> None:
        precise_timers(self._precise)
        self._begin()
        time.sleep(self._seconds)
        if ctx.attempt == 1 and self._threshold and self.fails(record):
            self.failed += 1
            raise ConnectionError("the service failed this once")
        self._end()


# --- eos: the transactional mode against at-least-once, with outputs --------------------------

_ALO_CTX = "alo+ctx"
# The eos case's engines: (label, transactional, produces outputs, transaction_interval_s).
EOS_ENGINES: list[tuple[str, bool, bool, float]] = [
    ("alo", False, False, 0.0),
    ("alo+out", False, True, 0.0),
    # weir's own at-least-once outputs (ctx.produce without transactional_id): confirmed by the
    # broker before their record is committed (docs/producing.md).
    (_ALO_CTX, False, True, 0.0),
    ("eos", True, True, 0.1),
    ("eos-1s", True, True, 1.0),
]
# The at-least-once pipeline's producer: durable and idempotent like the transactional one
# (acks=all), batching like it (linger.ms=5).
ALO_PRODUCER: dict[str, Any] = {"acks": "all", "enable.idempotence": True, "linger.ms": 5}


class _Transform(Handler):
    """The eos case's handler: optional sleep, then one output per record, through the
    transaction (`ctx.produce`) or a shared producer, or none."""

    def __init__(
        self,
        meter: Meter,
        sleep_s: float,
        precise: bool,
        output: str,
        how: str,  # "ctx", "producer" or "none"
        producer: Any = None,
    ) -> None:
        self.meter = meter
        self.sleep_s = sleep_s
        self.precise = precise
        self.output = output
        self.how = how
        self.producer = producer

    def handle(self, record: Record, ctx: Context) -> None:
        meter = self.meter
        if self.sleep_s:
            precise_timers(self.precise)
        meter.begin()
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.how == "ctx":
            ctx.produce(self.output, record.value, record.key)
        elif self.how == "producer":
            p = self.producer
            while True:
                try:
                    p.produce(self.output, record.value, record.key)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        meter.end()


class _Committed:
    """Commit listener: when the group's committed offsets first cover every record."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.offsets: dict[Any, int] = {}
        self.at: float | None = None

    def __call__(self, e: CommitEvent) -> None:
        if e.status != "committed" or self.at is not None:
            return
        self.offsets[e.tp] = max(self.offsets.get(e.tp, 0), e.offset)
        if sum(self.offsets.values()) >= self.total:
            self.at = time.perf_counter()


def run_eos(
    bk: Broker,
    topic: Topic,
    output: str,
    *,
    engine: str,
    transactional: bool,
    produces: bool,
    interval_s: float,
    handler_name: str,
    sleep_s: float,
    precise: bool,
    workers: int,
    max_seconds: float,
    settings: Tuning,
) -> Result:
    meter = Meter(topic.records)
    committed = _Committed(topic.records)
    producer = None
    ctx = transactional or engine == _ALO_CTX
    how = "ctx" if ctx else "producer" if produces else "none"
    if how == "producer":
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bk.bootstrap, **ALO_PRODUCER})
    group = unique("bench-eos")
    extra: dict[str, Any] = {}
    if transactional:
        extra = {"transactional_id": group, "transaction_interval_s": interval_s}
    tuning: Tuning = {**settings, "workers": workers, "flow": FLOWS["default"]}
    gc = GroupConsumer(
        _Transform(meter, sleep_s, precise, output, how, producer),
        bootstrap_servers=bk.bootstrap,
        group_id=group,
        topics=[topic.name],
        ordering="key",
        **tuning,
        **extra,
    )
    gc.add_commit_listener(committed)
    load = os.getloadavg()[0]
    watch = Watch(bk)
    started = time.perf_counter()
    gc.start()
    try:
        finished = meter.done.wait(max_seconds)
        cut_at = None if finished else time.perf_counter()
        # The run ends with the commit that covers every record (outputs visible, for eos).
        deadline = time.perf_counter() + 30
        while finished and committed.at is None and time.perf_counter() < deadline:
            time.sleep(0.005)
        cpu = watch.stop()
    finally:
        gc.stop()
        gc.join(60)
        if producer is not None:
            producer.flush(60)
    result = _result(
        "eos",
        engine,
        "default",
        handler_name,
        topic,
        meter,
        started,
        cut_at,
        cpu,
        {"workers": workers, "ordering": "key", **settings, **extra},
    )
    result.load = load
    if committed.at is not None and meter.first is not None:
        result.seconds_to_commit = committed.at - meter.first
        result.rate_to_commit = topic.records / result.seconds_to_commit
    st = gc.stats()
    result.throttles = st.throttles
    result.peak_in_flight = st.peak_in_flight
    result.rebalances = st.rebalances
    return result


def eos_report(results: list[Result]) -> str:
    """The eos case side by side: each engine's rates against at-least-once without output of
    the same round (`--eos-repeats`: the last `alo` run before it)."""
    rows = []
    base: dict[str, Result] = {}
    rounds: dict[str, int] = {}
    for r in results:
        if r.case != "eos":
            continue
        if r.engine == "alo":
            base[r.handler] = r
        rounds[r.handler + r.engine] = n = rounds.get(r.handler + r.engine, 0) + 1
        b = base.get(r.handler)
        rows.append(
            [
                str(n),
                "" if r.load is None else f"{r.load:.1f}",
                r.handler,
                r.engine,
                f"{r.records:,}" + (" (cut)" if r.cut else ""),
                fmt_rate(r.rate),
                "" if r.rate_to_commit is None else fmt_rate(r.rate_to_commit),
                "" if b is None else f"{r.rate / b.rate:.2f}x",
                ""
                if b is None or b.rate_to_commit is None or r.rate_to_commit is None
                else f"{r.rate_to_commit / b.rate_to_commit:.2f}x",
                "/".join(
                    "" if r.cpu[k] is None else f"{r.cpu[k]:.2f}"
                    for k in ("own_cores", "broker_cores", "other_cores")
                ),
            ]
        )
    header = [
        "round",
        "load",
        "handler",
        "engine",
        "records",
        "rec/s",
        "rec/s to commit",
        "x alo",
        "x alo to commit",
        "cpu own/broker/other",
    ]
    return table(rows, header)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_broker_args(p)
    p.add_argument("--quick", action="store_true", help="4x fewer records, shorter cut-off")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--noop-records",
        type=int,
        default=500_000,
        help="records per no-op run: at ~1M records/s the raw loop's run must outlast a few ms "
        "of noise from the broker sharing the cores (200k gave 0.2 s runs)",
    )
    p.add_argument("--io-records", type=int, default=40_000)
    p.add_argument(
        "--raw-io-records", type=int, default=2_000, help="sample for the serial 1 ms raw loop"
    )
    p.add_argument("--partitions", type=int, default=16, help="partitions of the main topics")
    p.add_argument("--keys", type=int, default=1_600, help="distinct keys of the main topics")
    p.add_argument("--value-size", type=int, default=100, help="bytes per record value")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument(
        "--max-in-flight", type=int, default=None, help="async cases: max_in_flight (weir's)"
    )
    p.add_argument("--aio-repeats", type=int, default=2, help="runs of each async case engine")
    p.add_argument(
        "--aio-engines",
        default="aiokafka,aiokafka:1000,async-key,key",
        help="engines of the async cases: aiokafka (getmany() whole), aiokafka:N (getmany("
        "max_records=N)), async-<mode>, <mode> (threads)",
    )
    p.add_argument("--tail-ms", type=float, default=100.0, help="slow records of the tail mix")
    p.add_argument("--aio-flow", default="default", help="flow budget of weir's async runs")
    p.add_argument("--io-ms", type=float, default=1.0, help="handler sleep in the I/O cases")
    p.add_argument(
        "--default-timer-slack",
        action="store_true",
        help="keep the kernel's 50 us timer slack in the I/O handler (sleeps then overshoot)",
    )
    p.add_argument("--raw-batch", type=int, default=500, help="consume() batch of the raw loop")
    p.add_argument(
        "--raw-librdkafka-defaults",
        action="store_true",
        help="run the raw loop with librdkafka's fetch defaults (see RAW_FETCH)",
    )
    p.add_argument(
        "--raw-repeats",
        type=int,
        default=3,
        help="no-op raw runs; the fastest is the baseline (the first one warms the broker up)",
    )
    p.add_argument(
        "--noop-repeats",
        type=int,
        default=3,
        help="no-op runs of each GroupConsumer mode, interleaved with the raw runs; the fastest "
        "is compared with the fastest raw run (and the medians with each other)",
    )
    p.add_argument(
        "--max-batch-records",
        type=int,
        default=None,
        help="GroupConsumer max_batch_records (default: weir's)",
    )
    p.add_argument(
        "--commit-every-records",
        type=int,
        default=None,
        help="commit cadence in records, for GroupConsumer and the raw loop (default: weir's)",
    )
    p.add_argument("--modes", default="key,partition,unordered", help="ordering modes to run")
    p.add_argument(
        "--batch-modes",
        default="key,unordered",
        help="no-op case: ordering modes of the no-op batch handler ('' for none)",
    )
    p.add_argument(
        "--batch-records", type=int, default=500, help="no-op case: batch_max_records of it"
    )
    p.add_argument("--flows", default="default,wide", help=f"flow budgets: {', '.join(FLOWS)}")
    p.add_argument(
        "--only",
        default="",
        help="cases to run: noop, io, io-1p, io-hot, failures, aio, aio-tail, eos, tracing "
        "(default: all)",
    )
    p.add_argument("--tracing-repeats", type=int, default=3, help="tracing: runs of each engine")
    p.add_argument("--failure-records", type=int, default=120_000, help="failures: per run")
    p.add_argument(
        "--fail-percent", type=float, default=1.0, help="failures: records failing once (%%)"
    )
    p.add_argument(
        "--fail-backoff-ms", type=float, default=50.0, help="failures: backoff before the retry"
    )
    p.add_argument(
        "--failure-repeats",
        type=int,
        default=2,
        help="failures: pairs of runs (no failures, then failures), alternating",
    )
    p.add_argument(
        "--eos-records",
        type=int,
        default=None,
        help="records per eos run (default: --io-records for the 1 ms handler, "
        "--noop-records / 5 for the no-op one)",
    )
    p.add_argument(
        "--eos-engines",
        default=",".join(e[0] for e in EOS_ENGINES),
        help="eos engines to run, in this order",
    )
    p.add_argument(
        "--eos-repeats", type=int, default=1, help="eos: rounds of the engines, interleaved"
    )
    p.add_argument("--max-seconds", type=float, default=30.0, help="cut a run after this long")
    args = p.parse_args(argv)
    if args.quick:
        args.noop_records = min(args.noop_records, 125_000)
        args.io_records = min(args.io_records, 10_000)
        args.raw_io_records = min(args.raw_io_records, 1_000)
        args.failure_records = min(args.failure_records, 30_000)
        args.max_seconds = min(args.max_seconds, 15.0)
    return args


def calibrate_sleep(seconds: float, *, precise: bool, n: int = 200) -> float:
    """What time.sleep(seconds) really takes in a handler thread here (timer slack and wake-up
    latency make it longer), measured on a thread of its own like a worker's."""
    took: list[float] = []

    def measure() -> None:
        precise_timers(precise)
        t = time.perf_counter()
        for _ in range(n):
            time.sleep(seconds)
        took.append((time.perf_counter() - t) / n)

    thread = threading.Thread(target=measure)
    thread.start()
    thread.join()
    return took[0]


def evaluate(results: list[Result]) -> None:
    raw: dict[str, Result] = {}
    best: dict[tuple[str, str, str], Result] = {}
    for r in results:  # the best raw run of each case is the baseline
        if r.engine == "raw" and (r.case not in raw or r.rate > raw[r.case].rate):
            raw[r.case] = r
        key = (r.case, r.engine, r.flow)
        if key not in best or r.rate > best[key].rate:
            best[key] = r
    # The peer of an async case is its fastest aiokafka run, whatever its getmany() size.
    peer: dict[str, Result] = {}
    for r in results:
        if r.engine.startswith("aiokafka") and (r.case not in peer or r.rate > peer[r.case].rate):
            peer[r.case] = r
    for r in results:
        if r.case in ("aio", "aio-tail"):
            base = peer.get(r.case)
            if not r.engine.startswith("aiokafka") and base is not None:
                r.vs_raw = r.rate / base.rate  # "x raw" of an async case: x aiokafka + gather
            if r.engine == "async-key" and r.vs_raw is not None:
                goal = AIO_TARGET if r.case == "aio" else AIO_TAIL_TARGET
                r.target = f">= {goal:.0f}x aiokafka"
                r.met = r.vs_raw >= goal
            continue
        base = raw.get(r.case)
        if r.engine != "raw" and base is not None:
            r.vs_raw = r.rate / base.rate
        if r.ideal:
            r.vs_ideal = r.rate / r.ideal
        if r.engine == "raw":
            continue
        if r.case == "noop":
            if r is not best[(r.case, r.engine, r.flow)]:
                continue  # the target is judged on the fastest run, as for the raw loop
            goal = BATCH_TARGET if r.engine.startswith("batch-") else NOOP_TARGET
            r.target = f">= {goal:.2f}x raw"
            r.met = None if r.vs_raw is None else r.vs_raw >= goal
        elif r.case == "failures":
            continue  # judged against its no-failure runs in failures_summary
        elif r.vs_ideal is not None and r.case in ("io", "io-1p"):
            r.target = f">= {IO_TARGET:.2f}x ideal"
            r.met = r.vs_ideal >= IO_TARGET


def cpu_per_record_us(r: Result) -> float:
    """The consumer process's CPU per record, us (start-up and group join included): steadier
    than the rate when other work shares the cores."""
    return (r.cpu.get("own_cores") or 0.0) * r.total_seconds / max(r.records, 1) * 1e6


def noop_summary(results: list[Result]) -> str:
    """Best and median of the repeated no-op runs, each against the raw loop's; the ratio of
    each run to the raw run of its round (they are interleaved); CPU and the garbage
    collector's CPU per run."""
    runs: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        if r.case == "noop":
            runs.setdefault((r.engine, r.flow), []).append(r)
    raw_runs = runs.pop(("raw", "-"), None)
    if not raw_runs:
        return ""
    raw = [r.rate for r in raw_runs]
    raw_best, raw_median = max(raw), statistics.median(raw)
    raw_cpu = statistics.median(map(cpu_per_record_us, raw_runs))
    lines = [
        f"no-op: raw loop best {fmt_rate(raw_best)}/s, median {fmt_rate(raw_median)}/s "
        f"({len(raw)} runs), CPU median {raw_cpu:.2f} us/record"
    ]
    for (engine, flow), rs in runs.items():
        rates = [r.rate for r in rs]
        best, median = max(rates), statistics.median(rates)
        per_round = ", ".join(f"{r.rate / w.rate:.2f}x" for r, w in zip(rs, raw_runs, strict=False))
        cpu = statistics.median(map(cpu_per_record_us, rs))
        gc_s = ", ".join(f"{r.cpu.get('gc_s') or 0:.2f}" for r in rs)
        lines.append(
            f"  {engine:<9} {flow:<7} best {fmt_rate(best):>8}/s = {best / raw_best:.2f}x best raw"
            f"   median {fmt_rate(median):>8}/s = {median / raw_median:.2f}x median raw"
            f"   ({len(rates)} runs)\n"
            f"    per round {per_round}; CPU median {cpu:.2f} us/record = "
            f"{raw_cpu / cpu:.2f}x the raw loop's records per CPU second; gc s {gc_s}"
        )
    return "\n".join(lines)


def span_dropping_provider() -> Any:
    """An OpenTelemetry SDK tracer provider as an application sets one up (a batch span
    processor), whose exporter drops the spans: what tracing costs weir and the SDK."""
    from collections.abc import Sequence

    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return provider


def tracing_summary(results: list[Result]) -> str:
    """Tracing on against off for each handler, median against median and best against best."""
    lines = []
    for handler in ("noop", "1ms"):
        runs = [r for r in results if r.case == "tracing" and r.handler == handler]
        off = [r.rate for r in runs if r.engine == "key"]
        on = [r.rate for r in runs if r.engine == "key+trace"]
        if not off or not on:
            continue
        lines.append(
            f"tracing ({handler}, key mode): off median {fmt_rate(statistics.median(off))}/s, "
            f"on median {fmt_rate(statistics.median(on))}/s = "
            f"{statistics.median(on) / statistics.median(off):.2f}x; best "
            f"{fmt_rate(max(off))}/s and {fmt_rate(max(on))}/s = {max(on) / max(off):.2f}x "
            f"({len(off)} + {len(on)} runs)"
        )
    return "\n".join(lines)


def failures_summary(results: list[Result]) -> str:
    """The runs with failures against the runs without, best against best and median against
    median; the target is judged on the best runs, as for the no-op case."""
    clean = [r for r in results if r.case == "failures" and r.handler == "1ms"]
    failing = [r for r in results if r.case == "failures" and r.handler != "1ms"]
    if not clean or not failing:
        return ""
    best_clean = max(clean, key=lambda r: r.rate)
    best = max(failing, key=lambda r: r.rate)
    for r in failing:
        r.vs_no_failures = r.rate / best_clean.rate
    best.target = f">= {FAILURES_TARGET:.2f}x no failures"
    best.met = best.rate / best_clean.rate >= FAILURES_TARGET
    median_clean = statistics.median(r.rate for r in clean)
    median = statistics.median(r.rate for r in failing)
    return (
        f"failures ({best.handler}, key mode): no failures best {fmt_rate(best_clean.rate)}/s, "
        f"with failures best {fmt_rate(best.rate)}/s = {best.rate / best_clean.rate:.2f}x; "
        f"medians {fmt_rate(median_clean)}/s and {fmt_rate(median)}/s = "
        f"{median / median_clean:.2f}x ({len(clean)} + {len(failing)} runs; retries per "
        f"failing run: {', '.join(str(r.retries) for r in failing)}). Target "
        f">= {FAILURES_TARGET:.2f}x: {'met' if best.met else 'NOT met'}."
    )


def report(results: list[Result]) -> str:
    def ratio(x: float | None) -> str:
        return "" if x is None else f"{x:.2f}x"

    def cores(x: float | None) -> str:
        return "" if x is None else f"{x:.2f}"

    rows = [
        [
            r.case,
            r.engine,
            r.flow,
            r.handler,
            f"{r.partitions}/{r.keys}",
            f"{r.records:,}" + (" (cut)" if r.cut else ""),
            f"{r.seconds:.2f}",
            fmt_rate(r.rate),
            f"{r.join_seconds:.2f}",
            fmt_rate(r.rate_total),
            ratio(r.vs_raw),
            "" if r.ideal is None else fmt_rate(r.ideal),
            ratio(r.vs_ideal),
            ratio(r.vs_no_failures),
            "" if r.throttles is None else r.throttles,
            "/".join(cores(r.cpu[k]) for k in ("own_cores", "broker_cores", "other_cores")),
            "" if r.met is None else ("yes" if r.met else "NO"),
        ]
        for r in results
    ]
    header = [
        "case",
        "engine",
        "flow",
        "handler",
        "parts/keys",
        "records",
        "s",
        "rec/s",
        "join s",
        "rec/s incl. join",
        "x raw",
        "ideal/s",
        "x ideal",
        "x no-fail",
        "throttles",
        "cpu own/broker/other",
        "target met",
    ]
    return table(rows, header)


def run_async_cases(
    bk: Broker,
    t: Topic,
    args: argparse.Namespace,
    only: set[str],
    record: Callable[[Result], None],
    async_handlers: dict[str, Callable[[Meter], Any]],
    thread_handlers: dict[str, Callable[[Meter], HandlerFn]],
    aio_settings: Tuning,
    settings: Tuning,
) -> None:
    """aio and aio-tail: the aiokafka + gather loop, weir's async mode and weir's threads, on
    the same topic, interleaved run by run."""
    engines = [e for e in args.aio_engines.split(",") if e]
    cases = [c for c in ("aio", "aio-tail") if not only or c in only]
    names = {"aio": f"{args.io_ms:g}ms", "aio-tail": f"{args.io_ms:g}/{args.tail_ms:g}ms 1%"}
    for _ in range(args.aio_repeats):
        for case in cases:
            for engine in engines:
                if engine.startswith("aiokafka"):
                    _, _, cap = engine.partition(":")
                    r = run_aiokafka(
                        bk,
                        t,
                        t.records,
                        async_handlers[case],
                        case=case,
                        handler_name=names[case],
                        max_seconds=args.max_seconds,
                        max_records=int(cap) if cap else None,
                    )
                elif engine.startswith("async-"):
                    r = run_weir(
                        bk,
                        t,
                        t.records,
                        async_handlers[case],
                        case=case,
                        handler_name=names[case],
                        ordering=engine.removeprefix("async-"),
                        flow=args.aio_flow,
                        workers=args.workers,
                        max_seconds=args.max_seconds,
                        settings=aio_settings,
                    )
                    r.engine = engine
                else:
                    r = run_weir(
                        bk,
                        t,
                        t.records,
                        thread_handlers[case],
                        case=case,
                        handler_name=names[case],
                        ordering=engine,
                        flow="default",
                        workers=args.workers,
                        max_seconds=args.max_seconds,
                        settings=settings,
                    )
                record(r)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_logging()
    names = [m for m in args.modes.split(",") if m]
    for m in names:
        if m not in ORDERINGS:
            raise SystemExit(f"unknown mode {m!r}: choose from {', '.join(ORDERINGS)}")
    modes = [ORDERINGS[m] for m in names]
    batch_modes: list[Ordering] = []
    for m in (m for m in args.batch_modes.split(",") if m):
        if m not in ORDERINGS:
            raise SystemExit(f"unknown batch mode {m!r}: choose from {', '.join(ORDERINGS)}")
        batch_modes.append(ORDERINGS[m])
    flows = [f for f in args.flows.split(",") if f]
    for f in flows:
        if f not in FLOWS:
            raise SystemExit(f"unknown flow {f!r}: choose from {', '.join(FLOWS)}")
    only = {c for c in args.only.split(",") if c}
    io_s = args.io_ms / 1000
    slept = calibrate_sleep(io_s, precise=not args.default_timer_slack)
    raw_fetch = {} if args.raw_librdkafka_defaults else RAW_FETCH
    settings: Tuning = {}
    if args.max_batch_records is not None:
        settings["max_batch_records"] = args.max_batch_records
    if args.commit_every_records is not None:
        settings["commit_every_records"] = args.commit_every_records
    raw_cadence = {
        "commit_every_records": settings.get(
            "commit_every_records", DEFAULTS["commit_every_records"]
        )
    }
    env = environment()
    print(
        f"# throughput: noop={args.noop_records:,} io={args.io_records:,} "
        f"partitions={args.partitions} keys={args.keys} workers={args.workers} "
        f"io={args.io_ms:g} ms (time.sleep takes {slept * 1e3:.3f} ms here) "
        f"cpus={env['cpus']} loadavg={env['loadavg_at_start'][0]:.1f}",
        flush=True,
    )

    def noop(m: Meter) -> HandlerFn:
        return noop_handler(m)

    def anoop(m: Meter) -> Any:
        return async_noop_handler(m)

    precise = not args.default_timer_slack
    tail_s = args.tail_ms / 1000

    def aio(m: Meter) -> Any:
        return async_sleep_handler(m, io_s, precise=precise)

    def aio_tail(m: Meter) -> Any:
        return async_sleep_handler(m, io_s, tail_s, precise=precise)

    def io_tail(m: Meter) -> HandlerFn:
        return tail_handler(m, io_s, tail_s, precise=precise)

    aio_settings: Tuning = {**settings}
    if args.max_in_flight is not None:
        aio_settings["max_in_flight"] = args.max_in_flight

    def io(m: Meter) -> HandlerFn:
        return sleep_handler(m, io_s, precise=not args.default_timer_slack)

    results: list[Result] = []

    def record(r: Result) -> None:
        results.append(r)
        print(
            f"  {r.case:<6} {r.engine:<9} {r.flow:<7} {r.handler:<4} {r.records:>8,} rec "
            f"{fmt_rate(r.rate):>8}/s  join {r.join_seconds:.2f}s  "
            f"cpu {r.cpu['own_cores']:.2f} cores  gc {r.cpu.get('gc_s') or 0:.2f}s"
            f"  threads: {thread_summary(r.cpu)}"
            f"{'  CUT' if r.cut else ''}"
            + (f"  {r.settings}" if r.engine.startswith("aiokafka") else ""),
            flush=True,
        )

    plan = [
        ("noop", args.noop_records, args.partitions, args.keys),
        ("io", args.io_records, args.partitions, args.keys),
        ("io-1p", args.io_records, 1, 100),
        ("io-hot", args.io_records, args.partitions, args.partitions),
        ("failures", args.failure_records, args.partitions, args.keys),
        ("aio", args.io_records, args.partitions, args.keys),
        ("eos-noop", args.eos_records or args.noop_records // 5, args.partitions, args.keys),
        ("eos-io", args.eos_records or args.io_records, args.partitions, args.keys),
        ("tracing", args.noop_records, args.partitions, args.keys),
    ]
    if "aio-tail" in only:
        only.add("aio")  # the same topic
    with broker_from(args) as bk:
        topics: dict[str, Topic] = {}
        outputs: list[str] = []
        for case, n, parts, keys in plan:
            if only and case not in only and not (case.startswith("eos-") and "eos" in only):
                continue
            t = Topic(unique(f"bench-{case}"), n, parts, keys)
            create_topic(bk.bootstrap, t.name, parts)
            secs = produce(
                bk.bootstrap, t.name, n, value_size=args.value_size, partitions=parts, keys=keys
            )
            print(
                f"# produced {n:,} x {args.value_size} B to {t.name} "
                f"({parts} partitions, {keys} keys) in {secs:.1f}s",
                flush=True,
            )
            topics[case] = t
        try:
            common = {"workers": args.workers, "max_seconds": args.max_seconds}
            if "noop" in topics:
                t = topics["noop"]
                # Interleaved, so a slow or fast spell of this shared machine (the raw loop is
                # bimodal here) falls on every engine alike.
                for rep in range(max(args.raw_repeats, args.noop_repeats)):
                    if rep < args.raw_repeats:
                        record(
                            run_raw(
                                bk,
                                t,
                                t.records,
                                noop,
                                case="noop",
                                handler_name="noop",
                                batch=args.raw_batch,
                                max_seconds=args.max_seconds,
                                fetch=raw_fetch,
                                **raw_cadence,
                            )
                        )
                    if rep >= args.noop_repeats:
                        continue
                    for flow in flows:
                        for mode in modes:
                            record(
                                run_weir(
                                    bk,
                                    t,
                                    t.records,
                                    noop,
                                    case="noop",
                                    handler_name="noop",
                                    ordering=mode,
                                    flow=flow,
                                    settings=settings,
                                    **common,
                                )
                            )
                    for mode in batch_modes:
                        r = run_weir(
                            bk,
                            t,
                            t.records,
                            NoopBatch,
                            case="noop",
                            handler_name="batch noop",
                            ordering=mode,
                            flow="default",
                            settings={**settings, "batch_max_records": args.batch_records},
                            **common,
                        )
                        r.engine = f"batch-{mode}"
                        record(r)
                    if not any(e.startswith("async-") for e in args.aio_engines.split(",")):
                        continue
                    r = run_weir(
                        bk,
                        t,
                        t.records,
                        anoop,
                        case="noop",
                        handler_name="async noop",
                        ordering="key",
                        flow="default",
                        settings=aio_settings,
                        **common,
                    )
                    r.engine = "async-key"
                    record(r)
            if "io" in topics:
                t = topics["io"]
                r = run_raw(
                    bk,
                    t,
                    min(args.raw_io_records, t.records),
                    io,
                    case="io",
                    handler_name="1ms",
                    batch=args.raw_batch,
                    max_seconds=args.max_seconds,
                    fetch=raw_fetch,
                    **raw_cadence,
                )
                r.ideal = 1 / io_s
                record(r)
                for flow in flows:
                    for mode in modes:
                        r = run_weir(
                            bk,
                            t,
                            t.records,
                            io,
                            case="io",
                            handler_name="1ms",
                            ordering=mode,
                            flow=flow,
                            settings=settings,
                            **common,
                        )
                        lanes = {"key": t.keys, "partition": t.partitions}.get(mode, args.workers)
                        r.ideal = min(args.workers, lanes) / io_s
                        record(r)
            for case, sleep_s in (("eos-noop", 0.0), ("eos-io", io_s)):
                if case not in topics:
                    continue
                t = topics[case]
                chosen = {e: i for i, e in enumerate(args.eos_engines.split(",")) if e}
                unknown = set(chosen) - {e[0] for e in EOS_ENGINES}
                if unknown:
                    raise SystemExit(f"--eos-engines: no engine {', '.join(sorted(unknown))}")
                engines = sorted(
                    (e for e in EOS_ENGINES if e[0] in chosen), key=lambda e: chosen[e[0]]
                )
                for engine, transactional, produces, interval in engines * args.eos_repeats:
                    out = unique("bench-eos-out")
                    create_topic(bk.bootstrap, out, t.partitions)
                    outputs.append(out)
                    r = run_eos(
                        bk,
                        t,
                        out,
                        engine=engine,
                        transactional=transactional,
                        produces=produces,
                        interval_s=interval,
                        handler_name="1ms" if sleep_s else "noop",
                        sleep_s=sleep_s,
                        precise=not args.default_timer_slack,
                        workers=args.workers,
                        max_seconds=args.max_seconds,
                        settings=settings,
                    )
                    if sleep_s:
                        r.ideal = min(args.workers, t.keys) / io_s
                    record(r)
            for case in ("io-1p", "io-hot"):
                if case not in topics:
                    continue
                t = topics[case]
                for flow in flows:
                    r = run_weir(
                        bk,
                        t,
                        t.records,
                        io,
                        case=case,
                        handler_name="1ms",
                        ordering="key",
                        flow=flow,
                        settings=settings,
                        **common,
                    )
                    r.ideal = min(args.workers, t.keys) / io_s
                    record(r)
            if "failures" in topics:
                t = topics["failures"]
                backoff = args.fail_backoff_ms / 1000
                policy = FailurePolicy(
                    retry=RetryPolicy(
                        max_attempts=3, backoff_initial_s=backoff, backoff_max_s=backoff
                    )
                )
                label = f"1ms+{args.fail_percent:g}%"
                for _ in range(args.failure_repeats):
                    for percent in (0.0, args.fail_percent):

                        def failing(m: Meter, percent: float = percent) -> Handler:
                            precise = not args.default_timer_slack
                            return FailingIO(m, io_s, percent, precise=precise)

                        r = run_weir(
                            bk,
                            t,
                            t.records,
                            failing,
                            case="failures",
                            handler_name=label if percent else "1ms",
                            ordering="key",
                            flow="default",
                            settings={**settings, "failure": policy},
                            **common,
                        )
                        r.ideal = min(args.workers, t.keys) / io_s
                        record(r)
            if "tracing" in topics:
                t = topics["tracing"]
                provider = span_dropping_provider()
                try:
                    # The 1 ms handler on a part of the topic: it runs at ~workers/1 ms.
                    handlers = (("noop", noop, t.records), ("1ms", io, args.io_records))
                    for _ in range(args.tracing_repeats):
                        for name, fn, n in handlers:
                            for engine, traced in (("key", None), ("key+trace", provider)):
                                r = run_weir(
                                    bk,
                                    t,
                                    min(n, t.records),
                                    fn,
                                    case="tracing",
                                    handler_name=name,
                                    ordering="key",
                                    flow="default",
                                    settings=settings,
                                    tracer_provider=traced,
                                    **common,
                                )
                                r.engine = engine
                                record(r)
                finally:
                    provider.shutdown()
            if "aio" in topics:
                run_async_cases(
                    bk,
                    topics["aio"],
                    args,
                    only,
                    record,
                    {"aio": aio, "aio-tail": aio_tail},
                    {"aio": io, "aio-tail": io_tail},
                    aio_settings,
                    settings,
                )
        finally:
            if args.bootstrap:
                delete_topics(bk.bootstrap, [t.name for t in topics.values()] + outputs)

    evaluate(results)
    failures = failures_summary(results)
    print()
    print(report(results))
    if any(r.case == "eos" for r in results):
        print()
        print(eos_report(results))
    summary = noop_summary(results)
    if summary:
        print()
        print(summary)
    if failures:
        print()
        print(failures)
    traced = tracing_summary(results)
    if traced:
        print()
        print(traced)
    print(
        "\nrec/s: first record in a handler -> last out; join s: start() -> first record. "
        "cpu: cores used during the run by this process / the embedded broker / everything else "
        f"on the machine ({env['cpus']} cores in all). time.sleep({io_s:g}) takes "
        f"{slept * 1e3:.3f} ms here, so {args.workers} sleeping workers top out at "
        f"{fmt_rate(args.workers / slept)}/s = {io_s / slept:.2f}x the ideal."
    )
    noisy = {k: v for k, v in LOG_EVENTS.items() if k not in ("consumer_started",)}
    if noisy:
        print(f"engine warnings/errors logged: {noisy}")
    write_json(
        args.json,
        {
            "benchmark": "throughput",
            "environment": env,
            "args": vars(args),
            "sleep_calibrated_s": slept,
            "results": [dataclasses.asdict(r) for r in results],
            "log_events": dict(LOG_EVENTS),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
