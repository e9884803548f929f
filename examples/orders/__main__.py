"""``python -m examples.orders``: an order stream on a consumer group whose members come and go.

Three members consume a 6-partition topic while orders are produced; a fourth joins a quarter of the
way in, one leaves gracefully (SIGTERM) halfway, and the run ends by proving that every order was
processed, key order held, and the group's committed offsets reached the end of every partition.
See README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from examples.orders import Ledger, Summary
from examples.orders.member import Members
from weir import WeirError
from weir.lag import admin_client, group_lag
from weir.testing.errors import HarnessError

PARTITIONS = 6
CUSTOMERS = 48
JOIN_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0

# librdkafka prints warnings it retries anyway ("Coordinator load in progress" on a fresh broker)
# straight to stderr; routed through this logger, only errors get through.
KAFKA_LOG = logging.getLogger("examples.orders.kafka")
KAFKA_LOG.setLevel(logging.ERROR)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.orders",
        description="Orders on a weir consumer group whose members come and go (see README.md).",
    )
    ap.add_argument("--bootstrap", help="use this Kafka instead of starting an embedded broker")
    ap.add_argument("--records", type=int, default=3000, help="orders to produce (default 3000)")
    ap.add_argument("--rate", type=float, default=100.0, help="orders per second (default 100)")
    ap.add_argument("--quick", action="store_true", help="faster handlers and commits (for tests)")
    ap.add_argument(
        "--protocol",
        choices=["classic", "consumer"],
        default="classic",
        help="group protocol: classic (cooperative-sticky, the default) or consumer (KIP-848)",
    )
    ap.add_argument("--workers", type=int, default=4, help="worker threads per member")
    ap.add_argument("--timeout", type=float, default=120.0, help="give up after this many seconds")
    ap.add_argument("--summary-json", type=Path, help="also write the summary here as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the members' journals and logs")
    ap.add_argument("--member-log-level", default="info", help="level of the members' log files")
    return ap.parse_args(argv)


class OrderProducer(threading.Thread):
    """Produces `total` orders at a steady rate, so members join and leave mid-stream."""

    def __init__(self, bootstrap: str, topic: str, total: int, rate: float) -> None:
        super().__init__(name="order-producer", daemon=True)
        self.topic = topic
        self.total = total
        self.rate = rate
        self.delivered: dict[tuple[int, int], tuple[str, int]] = {}
        self.errors: list[str] = []
        self.halt = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "logger": KAFKA_LOG,
            }
        )

    def run(self) -> None:
        seqs: Counter[str] = Counter()
        start = time.monotonic()
        for i in range(self.total):
            if self.halt.is_set():
                break
            customer = f"c-{random.randrange(CUSTOMERS):03d}"
            seqs[customer] += 1
            order = {
                "order_id": f"o-{i:06d}",
                "customer": customer,
                "seq": seqs[customer],
                "amount": round(random.uniform(5, 250), 2),
            }
            self._producer.produce(
                self.topic,
                key=customer.encode(),
                value=json.dumps(order).encode(),
                on_delivery=functools.partial(self._on_delivery, customer, seqs[customer]),
            )
            self._producer.poll(0)
            # Pace against the start time, not the previous send, so the rate does not drift.
            self.halt.wait(max(0.0, start + (i + 1) / self.rate - time.monotonic()))
        if self.halt.is_set():
            self._producer.purge()
        self._producer.flush(30)

    def _on_delivery(self, customer: str, seq: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.delivered[(msg.partition(), msg.offset())] = (customer, seq)  # type: ignore[index]


class Offsets:
    """The group's committed offsets, the topic's end offsets and the lag, as `weir lag` reads
    them: `weir.lag.group_lag`, which joins nothing."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": KAFKA_LOG}
        # Made by weir.lag, so that it reads committed offsets with a consumer, as `weir lag`
        # does: librdkafka's admin call for them can crash the process (weir.lag's doc).
        self._admin = admin_client(conf)
        self._group = group
        self._topic = topic
        self.end: list[int] = [0] * PARTITIONS
        self.committed: list[int | None] = [None] * PARTITIONS
        self.lag: list[int] = [0] * PARTITIONS

    def refresh(self) -> None:
        try:
            rows = group_lag(self._admin, self._group, topics=[self._topic], timeout=5).partitions
        except WeirError:
            return  # the group is not known yet, or the broker was slow: keep the last view
        for row in rows:
            if row.log_end is not None:
                self.end[row.partition] = row.log_end
            self.committed[row.partition] = row.committed
            self.lag[row.partition] = row.lag or 0

    def matches(self, p: int) -> bool:
        # A partition that never got an order has nothing to commit.
        return self.committed[p] == self.end[p] or (self.end[p] == 0 and self.committed[p] is None)

    def close(self) -> None:
        pass  # an admin client has nothing to close


class Demo:
    """One run: set-up in the constructor (undone by `stack`), the scenario in `run`."""

    def __init__(
        self,
        args: argparse.Namespace,
        bootstrap: str,
        console: Console,
        stack: contextlib.ExitStack,
    ) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.args = args
        self.bootstrap = bootstrap
        self.console = console
        self.topic = f"orders-{run_id}"
        self.group = f"orders-demo-{run_id}"
        self.ledger = Ledger()
        self.started = time.monotonic()
        self.live: Live | None = None
        self._keep = args.keep
        self._last_progress = 0.0
        self._announced: dict[int, str] = {}
        # Registered in this order so the clean-up runs backwards: members stop first, then the
        # offsets client closes, then the topic goes (external broker only), then the journals.
        workdir = Path(tempfile.mkdtemp(prefix="weir-orders-"))
        stack.callback(self._remove_workdir, workdir)
        self._create_topic(stack)
        self.offsets = Offsets(bootstrap, self.group, self.topic)
        stack.callback(self.offsets.close)
        member_args = [
            *("--bootstrap", bootstrap, "--topic", self.topic, "--group", self.group),
            *("--protocol", args.protocol, "--workers", str(args.workers)),
            *("--log-level", args.member_log_level),
            *(("--max-ms", "10", "--commit-interval", "0.25") if args.quick else ()),
        ]
        self.members = Members(workdir, member_args)
        stack.callback(self.members.kill_all)
        self.producer = OrderProducer(bootstrap, self.topic, args.records, args.rate)
        stack.callback(self.producer.halt.set)
        self.say(f"topic [bold]{self.topic}[/] ({PARTITIONS} partitions), group {self.group}")
        self.say(f"members' journals and logs: {workdir}")

    def run(self) -> Summary:
        with Live(console=self.console, auto_refresh=False) as self.live:
            self._form_group()
            finished = self._play()
            self._stop_members()
        if not self.console.is_terminal:
            self.console.line()  # Live ends a non-terminal render without a newline
        summary = self._summary(timed_out=not finished)
        self._keep = self._keep or not summary.ok
        return summary

    def _form_group(self) -> None:
        for name in ("m1", "m2", "m3"):
            self.members.start(name)
        self.say("started members m1, m2, m3")
        self._wait(self._balanced, JOIN_TIMEOUT_S, "the members to join")
        self._announced = dict(self.ledger.owner)
        self.say(f"group formed: {self._ownership()}")

    def _play(self) -> bool:
        """Produce while m4 joins and m2 leaves; True once every order is committed in time."""
        records = self.args.records
        self.producer.start()
        self.say(f"producing {records} orders at {self.args.rate:g}/s")
        deadline = self.started + self.args.timeout
        m4_started: float | None = None
        m2_stopped = False
        while time.monotonic() < deadline:
            self._tick()
            sent = len(self.producer.delivered)
            if m4_started is None and sent >= records / 4:
                m4_started = time.monotonic()
                self.members.start("m4")
                self.say("[green]+ m4 joins the group[/]")
            # Leave only after the join has settled, so the two rebalances stay apart.
            settled = m4_started is not None and (
                "m4" in self.ledger.owner.values() or time.monotonic() - m4_started > 10
            )
            if not m2_stopped and settled and sent >= records / 2:
                m2_stopped = True
                self.members.terminate("m2")
                self.say("[yellow]- m2 gets SIGTERM: drain, commit, leave[/]")
            left = m2_stopped and self.members.all["m2"].exited
            if left and not self.producer.is_alive() and self._caught_up():
                self.say("every order is committed")
                return True
        self.say(f"[red]timed out after {self.args.timeout:g}s[/]")
        return False

    def _stop_members(self) -> None:
        self.say("stopping the remaining members")
        for m in self.members.running():
            self.members.terminate(m.name)
        self._wait(lambda: not self.members.running(), STOP_TIMEOUT_S, "the members to stop")
        self.members.kill_all(0)
        self.members.poll(self.ledger)
        # Their final synchronous commits are in: this is what the summary checks.
        self.offsets.refresh()
        self._show(final=True)

    def _tick(self) -> None:
        for m in self.members.poll(self.ledger):
            self.say(f"{m.name} {m.state}")
        self._announce_moves()
        self.offsets.refresh()
        self._show()
        time.sleep(0.25 if self.console.is_terminal else 0.5)

    # -- steps -----------------------------------------------------------------------------

    def _create_topic(self, stack: contextlib.ExitStack) -> None:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": KAFKA_LOG}
        admin = AdminClient(conf)
        admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic].result(30)
        if self.args.bootstrap:
            # Someone else's broker: leave it as we found it.
            stack.callback(self._delete_topic, admin)
        # Creation returns once the controller has it; wait until the broker serves all partitions.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(self.topic, timeout=5).topics.get(self.topic)
            parts = {} if meta is None or meta.error is not None else meta.partitions
            if len(parts) == PARTITIONS and all(pm.leader >= 0 for pm in parts.values()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"topic {self.topic} was not ready within 30 s")

    def _delete_topic(self, admin: AdminClient) -> None:
        with contextlib.suppress(Exception):
            admin.delete_consumer_groups([self.group])[self.group].result(10)
        with contextlib.suppress(Exception):
            admin.delete_topics([self.topic])[self.topic].result(10)

    def _wait(self, cond: Callable[[], bool], limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not cond():
            if time.monotonic() > deadline:
                self.say(f"[red]gave up waiting for {what} after {limit:g}s[/]")
                return
            self._tick()

    def _balanced(self) -> bool:
        owners = set(self.ledger.owner.values())
        running = {m.name for m in self.members.running()}
        return len(self.ledger.owner) == PARTITIONS and running <= owners

    def _caught_up(self) -> bool:
        offsets = self.offsets
        return self.producer.delivered.keys() <= self.ledger.seen and all(
            offsets.matches(p) for p in range(PARTITIONS)
        )

    def _summary(self, timed_out: bool) -> Summary:
        ledger, offsets = self.ledger, self.offsets
        produced = set(self.producer.delivered)
        failures = list(ledger.failures) + self.producer.errors
        failures += [f"{m.name} {m.state}" for m in self.members.all.values() if m.proc.returncode]
        return Summary(
            topic=self.topic,
            group=self.group,
            produced=len(produced),
            processed=ledger.total,
            distinct=len(ledger.seen),
            duplicates=ledger.total - len(ledger.seen),
            missing=len(produced - ledger.seen),
            order_violations=len(ledger.order_violations),
            committed=list(offsets.committed),
            end=list(offsets.end),
            partitions_ok=[offsets.matches(p) for p in range(PARTITIONS)],
            member_failures=failures,
            elapsed_s=round(time.monotonic() - self.started, 1),
            timed_out=timed_out,
        )

    def _remove_workdir(self, workdir: Path) -> None:
        if self._keep:
            self.console.print(f"kept the members' journals and logs in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    # -- output ----------------------------------------------------------------------------

    def say(self, message: str) -> None:
        # In a pipe or a CI log a line stays one line: rich would break it at 80 columns.
        self.console.print(
            f"[dim]{time.monotonic() - self.started:6.1f}s[/] {message}",
            soft_wrap=not self.console.is_terminal,
        )

    def _ownership(self) -> str:
        by_member: dict[str, list[int]] = {}
        for p, m in sorted(self.ledger.owner.items()):
            by_member.setdefault(m, []).append(p)
        return " ".join(f"{m}:{','.join(map(str, ps))}" for m, ps in sorted(by_member.items()))

    def _announce_moves(self) -> None:
        if not self._announced:
            return  # the group is still forming
        moves = [
            f"{p} {self._announced[p]}→{owner}"
            for p, owner in sorted(self.ledger.owner.items())
            if self._announced.get(p, owner) != owner
        ]
        self._announced.update(self.ledger.owner)
        if moves:
            self.say(f"partitions moved: {', '.join(moves)}")

    def _show(self, final: bool = False) -> None:
        assert self.live is not None
        self.live.update(
            Group(self._partition_table(), self._member_table()),
            refresh=self.console.is_terminal or final,
        )
        now = time.monotonic()
        if not self.console.is_terminal and not final and now - self._last_progress >= 5:
            # No live redraw in a pipe or CI log: a line every few seconds instead.
            self._last_progress = now
            offsets = self.offsets
            lag = sum(offsets.lag)
            views = [
                scrape(url)
                for m in self.members.running()
                if (url := self.ledger.metrics_url.get(m.name))
            ]
            ready = sum(1 for v in views if v and v.get("weir_ready"))
            self.say(
                f"produced {len(self.producer.delivered)}, processed {self.ledger.total}, "
                f"lag {lag} · {self._ownership() or 'no owners yet'} · "
                f"members ready {ready}/{len(self.members.running())}"
            )

    def _partition_table(self) -> Table:
        offsets, producer = self.offsets, self.producer
        elapsed = time.monotonic() - self.started
        table = Table(
            title=f"{self.topic}: produced {len(producer.delivered)}/{producer.total}"
            f" · {elapsed:.1f}s",
            title_justify="left",
        )
        for col in ("partition", "owner", "end offset", "committed", "lag", "processed"):
            table.add_column(col, justify="left" if col == "owner" else "right")
        for p in range(PARTITIONS):
            end, committed, lag = offsets.end[p], offsets.committed[p], offsets.lag[p]
            table.add_row(
                str(p),
                self._owner(p),
                str(end),
                "-" if committed is None else str(committed),
                f"[green]{lag}[/]" if offsets.matches(p) else f"[yellow]{lag}[/]",
                str(self.ledger.processed_by_partition[p]),
            )
        return table

    def _owner(self, p: int) -> str:
        owner = self.ledger.owner.get(p)
        if owner is None and p in self.ledger.last_owner:
            return f"[dim]was {self.ledger.last_owner[p]}[/]"
        return owner or "-"

    def _member_table(self) -> Table:
        table = Table(
            title="members (ready, lag, in flight, rebalances: each member's own /metrics)",
            title_justify="left",
        )
        cols = ("member", "state", "partitions", "processed", "ready", "lag", "in flight", "reb.")
        for col in cols:
            table.add_column(col, justify="left" if col in cols[:3] else "right")
        for m in self.members.all.values():
            owned = sorted(p for p, o in self.ledger.owner.items() if o == m.name)
            url = self.ledger.metrics_url.get(m.name)
            view = scrape(url) if url and m.state == "running" else None
            table.add_row(
                m.name,
                m.state,
                ",".join(map(str, owned)) or "-",
                str(self.ledger.processed_by_member[m.name]),
                *_member_view(view),
            )
        return table


def scrape(url: str) -> dict[str, float] | None:
    """A member's view of itself, from the Prometheus endpoint weir serves for it."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=0.5) as resp:
            text = resp.read().decode()
    except OSError:
        return None  # starting, or stopping
    view: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "weir_partition_lag_records":
                view["lag"] = view.get("lag", 0.0) + sample.value
            elif sample.name in ("weir_ready", "weir_in_flight_records", "weir_rebalances_total"):
                view[sample.name] = sample.value
    return view


def _member_view(view: dict[str, float] | None) -> tuple[str, str, str, str]:
    if view is None:
        return ("-", "-", "-", "-")
    ready = "[green]yes[/]" if view.get("weir_ready") else "[yellow]no[/]"
    return (
        ready,
        str(int(view.get("lag", 0))),
        str(int(view.get("weir_in_flight_records", 0))),
        str(int(view.get("weir_rebalances_total", 0))),
    )


def print_summary(console: Console, s: Summary) -> None:
    def mark(ok: bool) -> str:
        return "[green]✓[/]" if ok else "[red]✗[/]"

    table = Table(title="summary", title_justify="left", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    table.add_column()
    table.add_row("produced", str(s.produced), "")
    table.add_row("processed (incl. duplicates)", str(s.processed), mark(s.processed >= s.produced))
    table.add_row("distinct processed", str(s.distinct), mark(s.distinct == s.produced))
    table.add_row("duplicates", str(s.duplicates), "")
    table.add_row("missing", str(s.missing), mark(s.missing == 0))
    table.add_row("key-order violations", str(s.order_violations), mark(s.order_violations == 0))
    for p in range(PARTITIONS):
        committed = "-" if s.committed[p] is None else str(s.committed[p])
        table.add_row(
            f"partition {p}: committed / end", f"{committed} / {s.end[p]}", mark(s.partitions_ok[p])
        )
    table.add_row("member failures", str(len(s.member_failures)), mark(not s.member_failures))
    table.add_row("elapsed", f"{s.elapsed_s:.1f} s", mark(not s.timed_out))
    console.print(table)
    for failure in s.member_failures:
        console.print(f"[red]failure:[/] {failure}")
    verdict = "[bold green]PASS[/]" if s.ok else "[bold red]FAIL[/]"
    console.print(f"{verdict}: every order processed, key order kept, offsets committed to the end")


def start_broker(console: Console, stack: contextlib.ExitStack) -> str:
    # Imported here: only this path needs the Java harness.
    from weir.testing import EmbeddedKafka
    from weir.testing.jars import cached_jars

    if cached_jars() is None:
        console.print("downloading the Kafka jars with Maven (first run only, ~40 s)...")
    console.print("starting embedded Kafka...")
    started = time.monotonic()
    kafka = EmbeddedKafka()
    kafka.start()

    def stop() -> None:
        console.print("stopping embedded Kafka...")
        kafka.stop()

    stack.callback(stop)
    console.print(f"Kafka ready at {kafka.bootstrap_servers} in {time.monotonic() - started:.1f}s")
    return kafka.bootstrap_servers


def configure_logging() -> None:
    # The parent only prints the demo; weir's and the harness' info logs would tear the live view.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    # SIGTERM (a CI timeout, `kill`) takes the same clean path as Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    console = Console()
    try:
        with contextlib.ExitStack() as stack:
            bootstrap = args.bootstrap or start_broker(console, stack)
            summary = Demo(args, bootstrap, console, stack).run()
            # Before the clean-up, which takes a few seconds for the broker.
            print_summary(console, summary)
            if args.summary_json:
                data: dict[str, Any] = {**asdict(summary), "ok": summary.ok}
                args.summary_json.write_text(json.dumps(data, indent=2))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: members and broker stopped")
        return 130
    except HarnessError as exc:  # no Java, no Maven, a broker that would not start
        print(f"cannot start the embedded Kafka broker: {exc}", file=sys.stderr)
        print("(the demo can use a Kafka of yours instead: --bootstrap HOST:PORT)", file=sys.stderr)
        return 1
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
