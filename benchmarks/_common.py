"""Shared plumbing for the benchmarks: broker, topics, bulk produce, timing, output.

The scripts are run directly (``python benchmarks/throughput.py``), so this module is imported by
its bare name. Nothing here is part of weir's API.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import json
import logging
import os
import platform
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from confluent_kafka import Producer, TopicPartition
from confluent_kafka import __version__ as ck_version
from confluent_kafka import libversion as rdkafka_libversion
from confluent_kafka.admin import AdminClient, NewTopic
from structlog.typing import EventDict, WrappedLogger

# --- logging -------------------------------------------------------------------------------------

#: Engine log events seen so far (name -> count), whatever their level; see `quiet_logging`.
LOG_EVENTS: dict[str, int] = {}


def _collect(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    name = str(event_dict.get("event"))
    LOG_EVENTS[name] = LOG_EVENTS.get(name, 0) + 1
    return event_dict


def quiet_logging(level: int = logging.WARNING) -> None:
    """Print only warnings and above (the default structlog config prints debug lines, which would
    cost the engine a formatted line per commit), but count the events that are printed."""
    structlog.configure(
        processors=[
            _collect,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )


# --- broker --------------------------------------------------------------------------------------


def add_broker_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="use this running Kafka instead of starting the embedded broker",
    )
    parser.add_argument(
        "--broker-pid",
        type=int,
        metavar="PID",
        help="with --bootstrap: the broker's process (`weir broker start` writes it to its state "
        "file), for its CPU figures and --separate-cores",
    )
    parser.add_argument(
        "--separate-cores",
        action="store_true",
        help="run the broker on the first CPU and this process on the others, as on separate "
        "hosts: sharing the cores, the two take turns and single runs spread widely "
        "(benchmarks/README.md); the broker's own affinity is restored on exit",
    )


@dataclass(frozen=True)
class Broker:
    bootstrap: str
    pid: int | None
    """The embedded broker's JVM (None for `--bootstrap`): its CPU time is reported."""

    def cpu_seconds(self) -> float | None:
        if self.pid is None:
            return None
        import psutil

        try:
            t = psutil.Process(self.pid).cpu_times()
        except psutil.Error:
            return None
        return float(t.user + t.system)


@contextlib.contextmanager
def broker(
    bootstrap: str | None, *, pid: int | None = None, separate_cores: bool = False
) -> Iterator[Broker]:
    """An embedded single-node Kafka stopped on exit, or the one at `bootstrap` if given (`pid`:
    its process, if known). `separate_cores`: see `add_broker_args`."""
    if separate_cores and pid is None and bootstrap:
        raise SystemExit("--separate-cores with --bootstrap needs --broker-pid")
    with contextlib.ExitStack() as stack:
        if bootstrap:
            bk = Broker(bootstrap, pid)
        else:
            from weir.testing import EmbeddedKafka

            started = time.monotonic()
            kafka = stack.enter_context(EmbeddedKafka())
            print(
                f"# embedded Kafka at {kafka.bootstrap_servers} (pid {kafka.pid}), "
                f"started in {time.monotonic() - started:.1f}s",
                flush=True,
            )
            bk = Broker(kafka.bootstrap_servers, kafka.pid)
        with _separated(bk.pid if separate_cores else None):
            yield bk


def broker_from(args: argparse.Namespace) -> contextlib.AbstractContextManager[Broker]:
    """`broker` as `add_broker_args`'s options ask for it."""
    return broker(args.bootstrap, pid=args.broker_pid, separate_cores=args.separate_cores)


#: The CPUs of the broker and of this process under `--separate-cores` (set once for the run;
#: `write_json` records it with the environment).
SEPARATE_CORES: dict[str, list[int]] = {}


@contextlib.contextmanager
def _separated(pid: int | None) -> Iterator[None]:
    """The broker's threads (`pid`'s) on the first CPU this process may use, this process's on
    the rest; both as they were on exit. A thread started later inherits its creator's CPUs,
    so the JVM's later threads follow. Nothing when `pid` is None."""
    if pid is None:
        yield
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit(f"--separate-cores needs two CPUs, this process may use {cpus}")
    broker_cpus, own_cpus = {cpus[0]}, set(cpus[1:])
    before, own_before = _affinities(pid), _affinities(os.getpid())
    for tid in before:
        _set_affinity(tid, broker_cpus)
    for tid in own_before:
        _set_affinity(tid, own_cpus)
    SEPARATE_CORES.update(broker=sorted(broker_cpus), own=sorted(own_cpus))
    print(f"# broker on CPU {sorted(broker_cpus)}, this process on {sorted(own_cpus)}", flush=True)
    try:
        yield
    finally:
        for tid, mask in itertools.chain(before.items(), own_before.items()):
            _set_affinity(tid, mask)


def _affinities(pid: int) -> dict[int, set[int]]:
    """The CPUs of each thread of `pid` (a thread that ends meanwhile is left out)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError as exc:
        raise SystemExit(f"--separate-cores: no process {pid} to place ({exc})") from None
    out = {}
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):
            out[tid] = os.sched_getaffinity(tid)
    return out


def _set_affinity(tid: int, cpus: set[int]) -> None:
    with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
        os.sched_setaffinity(tid, cpus)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    futures[name].result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=5).topics.get(name)
        if (
            md is not None
            and md.error is None
            and len(md.partitions) == partitions
            and all(p.leader >= 0 for p in md.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leaders after {timeout}s")


def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    """Best effort: keeps a long-lived `--bootstrap` broker from filling up with benchmark data."""
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    for fut in admin.delete_topics(list(names), operation_timeout=30).values():
        with contextlib.suppress(Exception):
            fut.result(30)


# Throughput, not durability: one broker, big batches, no compression (the payloads are random).
FAST_PRODUCER = {
    "acks": 1,
    "enable.idempotence": False,
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "none",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 262_144,
    "message.max.bytes": 1_000_000,
}


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    value_size: int,
    partitions: int,
    keys: int,
) -> float:
    """Write `count` records and return the seconds it took.

    Record i has key ``k<i % keys>`` and goes to partition ``(i % keys) % partitions``: every key
    stays in one partition (as the default partitioner would keep it) and, with `keys` a multiple
    of `partitions`, every partition gets the same number of records and keys.
    """
    producer = Producer({"bootstrap.servers": bootstrap, **FAST_PRODUCER})
    payload = os.urandom(value_size)
    key_bytes = [b"k%d" % k for k in range(keys)]
    started = time.monotonic()
    send = producer.produce
    for i in range(count):
        k = i % keys
        while True:
            try:
                send(topic, payload, key_bytes[k], partition=k % partitions)
                break
            except BufferError:
                producer.poll(0.01)
        if not i & 0x3FFF:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} records were not delivered to {topic}")
    elapsed = time.monotonic() - started
    total = topic_size(bootstrap, topic, partitions)
    if total != count:
        raise RuntimeError(f"{topic} holds {total} records, expected {count}")
    return elapsed


def topic_size(bootstrap: str, topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("bench-size")})
    try:
        total = 0
        for p in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += high - low
        return total
    finally:
        c.close()


# --- timing --------------------------------------------------------------------------------------


class Meter:
    """Handler-side timing: the first record entering a handler to the `target`-th leaving one.

    Thread-safe enough for the purpose: `next()` on an itertools.count is atomic under the GIL,
    and `first` is written once (a racing second write differs by nanoseconds).
    """

    __slots__ = ("_count", "done", "first", "last", "n", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.first: float | None = None
        self.last: float | None = None
        self.n = 0  # records finished so far (approximate while handlers run)
        self._count = itertools.count(1)
        self.done = threading.Event()

    def begin(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        n = self.n = next(self._count)
        if n == self.target:
            self.last = time.perf_counter()
            self.done.set()

    @property
    def seconds(self) -> float:
        if self.first is None or self.last is None:
            return float("nan")
        return self.last - self.first


def noop_handler(meter: Meter) -> Callable[[object], None]:
    begin, end = meter.begin, meter.end

    def handle(record: object) -> None:
        begin()
        end()

    return handle


_PR_SET_TIMERSLACK = 29  # linux/prctl.h
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_tuned = threading.local()


def precise_timers(enabled: bool = True) -> None:
    """Give the calling thread a 1 ns timer slack (Linux), once per thread.

    With the default 50 us slack, `time.sleep(0.001)` takes ~1.08 ms here: 16 sleeping workers
    could then never pass 0.92x of the nominal workers / 1 ms, whatever weir does. The slack is
    the kernel's timer coalescing, not I/O and not weir's cost, so the I/O handler of the
    benchmarks turns it off for its own thread (`--default-timer-slack` keeps it).
    """
    if not enabled or _libc is None or getattr(_tuned, "done", False):
        return
    _libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    _tuned.done = True


def sleep_handler(
    meter: Meter, seconds: float, *, precise: bool = True
) -> Callable[[object], None]:
    begin, end, sleep = meter.begin, meter.end, time.sleep

    def handle(record: object) -> None:
        precise_timers(precise)
        begin()
        sleep(seconds)
        end()

    return handle


def is_tail(partition: int, offset: int, percent: int = 1) -> bool:
    """The records of the tail mix that are slow: `percent` % of them, spread over keys and
    partitions by a hash of (partition, offset), the same for every engine."""
    return zlib.crc32(b"%d/%d" % (partition, offset)) % 100 < percent


def tail_handler(
    meter: Meter, fast: float, slow: float, *, precise: bool = True
) -> Callable[[Any], None]:
    """A thread handler sleeping `slow` seconds on the tail records, `fast` on the others."""
    begin, end, sleep = meter.begin, meter.end, time.sleep

    def handle(record: Any) -> None:
        precise_timers(precise)
        begin()
        sleep(slow if is_tail(record.partition, record.offset) else fast)
        end()

    return handle


def async_sleep_handler(
    meter: Meter, fast: float, slow: float | None = None, *, precise: bool = True
) -> Callable[[Any], Awaitable[None]]:
    """An async handler awaiting `asyncio.sleep(fast)` (or `slow` on the tail records): a
    non-blocking I/O wait. Takes a weir `Record` or an aiokafka message alike."""
    begin, end, sleep = meter.begin, meter.end, asyncio.sleep

    async def handle(record: Any) -> None:
        precise_timers(precise)
        begin()
        if slow is not None and is_tail(record.partition, record.offset):
            await sleep(slow)
        else:
            await sleep(fast)
        end()

    return handle


def async_noop_handler(meter: Meter) -> Callable[[Any], Awaitable[None]]:
    begin, end = meter.begin, meter.end

    async def handle(record: Any) -> None:
        begin()
        end()

    return handle


# Thread families, by name: weir's threads are named, librdkafka names its own (`rdk:broker3`).
_THREAD_GROUPS = (
    ("weir-worker-", "workers"),
    ("weir-owner", "owner"),
    ("weir-loop", "loop"),
    ("rdk:", "librdkafka"),
    ("MainThread", "main"),
)


def thread_seconds() -> dict[int, tuple[str, float]]:
    """CPU seconds of every thread of this process so far, by native id, with its family
    (`_THREAD_GROUPS`, else "other"): the scheduler's own count of the time each ran
    (/proc schedstat, in nanoseconds; the tick-sampled counts in /proc stat missed threads that
    run in short bursts). Empty where /proc is not there."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ran_ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        name = names.get(int(tid), comm)
        group = next((g for prefix, g in _THREAD_GROUPS if name.startswith(prefix)), "other")
        out[int(tid)] = (group, ran_ns / 1e9)
    return out


class CpuWatch:
    """CPU used during a run, in cores: this process, the embedded broker, and everything else
    on the machine (other work competing for the same 2 cores makes a run slower); and this
    process's CPU seconds per thread family (`thread_s:owner`, `thread_s:workers`, ...: which
    thread a run's time went to)."""

    def __init__(self, bk: Broker) -> None:
        import psutil

        self._psutil = psutil
        self._bk = bk
        self.start()

    def _sample(self) -> tuple[float, float, float | None, float]:
        t = self._psutil.cpu_times()
        busy = t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)
        return time.perf_counter(), time.process_time(), self._bk.cpu_seconds(), busy

    def start(self) -> None:
        self._threads0 = thread_seconds()
        self._t0 = self._sample()

    def stop(self) -> dict[str, float | None]:
        w1, p1, b1, s1 = self._sample()
        w0, p0, b0, s0 = self._t0
        wall = max(w1 - w0, 1e-9)
        own = (p1 - p0) / wall
        brk = None if b0 is None or b1 is None else (b1 - b0) / wall
        other = (s1 - s0) / wall - own - (brk or 0.0)
        out: dict[str, float | None] = {
            "own_cores": own,
            "broker_cores": brk,
            "other_cores": max(other, 0.0),
        }
        for tid, (group, seconds) in thread_seconds().items():
            key = f"thread_s:{group}"
            before = self._threads0.get(tid, (group, 0.0))[1]
            out[key] = (out.get(key) or 0.0) + seconds - before
        return out


def thread_summary(cpu: dict[str, float | None]) -> str:
    """`owner 1.08 s, librdkafka 0.13 s`: the thread families' CPU seconds of a run (`CpuWatch`),
    the largest first; those under 10 ms left out."""
    groups = [(k.split(":", 1)[1], v or 0.0) for k, v in cpu.items() if k.startswith("thread_s:")]
    return ", ".join(f"{g} {v:.2f} s" for g, v in sorted(groups, key=lambda x: -x[1]) if v >= 0.01)


# --- output --------------------------------------------------------------------------------------


def _git_revision() -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
            check=False,
        ).stdout.strip()
    except OSError:
        return "?"


def environment() -> dict[str, Any]:
    import weir

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "weir": getattr(weir, "__version__", "?"),
        "git": _git_revision(),
        "confluent_kafka": ck_version,
        "librdkafka": rdkafka_libversion()[0],
        "loadavg_at_start": os.getloadavg(),
    }


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A GitHub-flavoured markdown table (reads fine in a terminal too)."""
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """`data` as JSON at `path` (if given); its `environment`, taken before the broker was
    placed, gets the placement (`separate_cores`, None when shared)."""
    if isinstance(data.get("environment"), dict):
        data["environment"]["separate_cores"] = dict(SEPARATE_CORES) or None
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=2, default=str)
        print(f"# results written to {path}")


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"
