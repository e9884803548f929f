"""Backpressure: drain a large backlog through a slow handler and watch the consumer's memory.

    python benchmarks/backpressure.py [--quick] [--records N] [--json out.json]

A topic is filled with ``--records`` records of 1 KiB (default 1M = 1 GiB), then drained by a
consumer running in a child process whose RSS the parent samples with psutil every 20 ms (plus
the child's own high-water mark, VmHWM). The handler sleeps ``--sleep-ms`` (0.2 ms) on
``--workers`` (8) threads, much slower than fetching, so the backlog piles up in front of it and
only flow control bounds memory.

Runs:

* weir/bytes:   GroupConsumer whose byte budget binds (record marks raised out of the way);
* weir/default: GroupConsumer with weir's default FlowConfig (the record marks bind first);
* raw:          a plain confluent-kafka consumer with librdkafka defaults, handler inline.

Runs that cannot finish in ``--max-seconds`` are cut: memory reaches its plateau within seconds,
so the peak is still meaningful, and the drain rate is reported for what was processed.

Goal: peak RSS <= flow.capacity_bytes + librdkafka's stated bound + 64 MiB, where the bound is
queued.max.messages.kbytes (as weir sets it) + fetch.max.bytes (one fetch response in flight).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import (
    LOG_EVENTS,
    add_broker_args,
    broker_from,
    create_topic,
    delete_topics,
    environment,
    fmt_rate,
    mib,
    produce,
    quiet_logging,
    table,
    unique,
    write_json,
)

MiB = 1024 * 1024
SLACK = 64 * MiB
LIBRDKAFKA_DEFAULTS = {"queued.max.messages.kbytes": 65_536, "fetch.max.bytes": 52_428_800}

# Flow budgets as keyword arguments for FlowConfig (built in the child, which imports weir).
FLOWS: dict[str, dict[str, int]] = {
    # The byte marks are weir's defaults (96/64/32 MiB); the record marks are raised so that with
    # 1 KiB records the bytes bind.
    "bytes": {"capacity_records": 200_000, "pause_records": 150_000, "resume_records": 100_000},
    "default": {},
}


# --- child: one consumer, measured --------------------------------------------------------------


def rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def peak_rss() -> int:
    """This process's high-water RSS (VmHWM). Not ru_maxrss: Linux carries that over from the
    parent across fork + exec, so a child of a big parent would report the parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(args: argparse.Namespace) -> None:
    """Consume `args.records` from `args.topic`, then write a JSON result to `args.result`."""
    import gc as pygc
    import threading

    from _common import Meter, sleep_handler

    quiet_logging()
    meter = Meter(args.records)
    handler = sleep_handler(meter, args.sleep_ms / 1000)
    out: dict[str, Any] = {"mode": args.child}
    samples: list[dict[str, Any]] = []
    if args.child == "weir":
        from weir import FlowConfig, GroupConsumer

        flow = FlowConfig(**FLOWS[args.flow])
        consumer = GroupConsumer(
            handler,
            bootstrap_servers=args.bootstrap,
            group_id=unique("bench-bp"),
            topics=[args.topic],
            workers=args.workers,
            flow=flow,
        )
        conf = consumer.config.librdkafka_config()
        out["flow"] = flow.model_dump()
        out["queued_max_messages_kbytes"] = int(conf["queued.max.messages.kbytes"])
        default_fetch = LIBRDKAFKA_DEFAULTS["fetch.max.bytes"]
        out["fetch_max_bytes"] = int(conf.get("fetch.max.bytes", default_fetch))
        pygc.collect()
        out["baseline_rss"] = rss()
        print("READY", flush=True)
        started = time.perf_counter()
        consumer.start()
        deadline = started + args.max_seconds
        while not meter.done.wait(1.0) and time.perf_counter() < deadline:
            st = consumer.stats()
            samples.append(
                {"t": time.perf_counter() - started, "in_flight_bytes": st.in_flight_bytes}
            )
            if consumer.failure is not None:
                break
        ended = meter.last if meter.last is not None else time.perf_counter()
        consumer.stop()
        consumer.join(60)
        st = consumer.stats()
        out["stats"] = {
            "processed": st.processed,
            "peak_in_flight": st.peak_in_flight,
            "peak_in_flight_bytes": st.peak_in_flight_bytes,
            "throttles": st.throttles,
            "pauses": st.pauses,
            "rebalances": st.rebalances,
            "failed": st.failed,
        }
    else:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": args.bootstrap,
                "group.id": unique("bench-bp-raw"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        out["queued_max_messages_kbytes"] = LIBRDKAFKA_DEFAULTS["queued.max.messages.kbytes"]
        out["fetch_max_bytes"] = LIBRDKAFKA_DEFAULTS["fetch.max.bytes"]
        pygc.collect()
        out["baseline_rss"] = rss()
        print("READY", flush=True)
        started = time.perf_counter()
        deadline = started + args.max_seconds
        c.subscribe([args.topic])
        stop = threading.Event()
        since_commit, last_commit = 0, time.monotonic()
        while not meter.done.is_set() and time.perf_counter() < deadline and not stop.is_set():
            msgs = c.consume(500, 0.1)
            for m in msgs:
                if m.error() is None:
                    handler(m)
            since_commit += len(msgs)
            now = time.monotonic()
            if since_commit and (since_commit >= 1000 or now - last_commit >= 1.0):
                c.commit(asynchronous=True)
                since_commit, last_commit = 0, now
        ended = meter.last if meter.last is not None else time.perf_counter()
        c.close()
    first = meter.first if meter.first is not None else ended
    processed = args.records if meter.last is not None else meter.n
    out.update(
        processed=processed,
        cut=meter.last is None,
        join_seconds=first - started,
        drain_seconds=ended - first,
        rate=processed / max(ended - first, 1e-9),
        hwm_rss=peak_rss(),
        in_flight_samples=samples,
        log_events=dict(LOG_EVENTS),
    )
    with open(args.result, "w") as f:
        json.dump(out, f)


# --- parent: produce, spawn, sample ------------------------------------------------------------


@dataclasses.dataclass
class Run:
    name: str
    mode: str
    flow: str
    result: dict[str, Any]
    peak_rss: int
    rss_timeline: list[tuple[float, int]]
    capacity_bytes: int | None
    client_bound: int
    goal: int
    met: bool
    max_poll_exceeded: int
    rebalance_ok: bool | None


def spawn(
    args: argparse.Namespace, bootstrap: str, topic: str, mode: str, flow: str, max_seconds: float
) -> tuple[dict[str, Any], int, list[tuple[float, int]]]:
    import psutil

    fd, result_path = tempfile.mkstemp(prefix="weir-bp-", suffix=".json")
    os.close(fd)
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--bootstrap",
        bootstrap,
        "--topic",
        topic,
        "--records",
        str(args.records),
        "--workers",
        str(args.workers),
        "--sleep-ms",
        str(args.sleep_ms),
        "--flow",
        flow,
        "--max-seconds",
        str(max_seconds),
        "--result",
        result_path,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            proc.wait(30)
            raise RuntimeError(f"child failed to start (exit {proc.returncode}): {line!r}")
        ps = psutil.Process(proc.pid)
        t0 = time.perf_counter()
        timeline: list[tuple[float, int]] = []
        peak = 0
        last_kept = -1.0
        while proc.poll() is None:
            try:
                value = int(ps.memory_info().rss)
            except psutil.Error:
                break
            now = time.perf_counter() - t0
            if value > peak:
                peak = value
            if now - last_kept >= 0.5:
                timeline.append((round(now, 2), value))
                last_kept = now
            time.sleep(0.02)
        proc.wait(max_seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"child exited with {proc.returncode}")
        with open(result_path) as f:
            result = json.load(f)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.unlink(result_path)
    return result, max(peak, int(result["hwm_rss"])), timeline


def evaluate(
    name: str, mode: str, flow: str, res: dict[str, Any], peak: int, tl: list[tuple[float, int]]
) -> Run:
    bound = res["queued_max_messages_kbytes"] * 1024 + res["fetch_max_bytes"]
    capacity = res["flow"]["capacity_bytes"] if mode == "weir" else None
    goal = (capacity or 0) + bound + SLACK
    events = res.get("log_events", {})
    rebalance_ok = None
    if mode == "weir":
        rebalance_ok = res["stats"]["rebalances"] == 1 and "partitions_lost" not in events
    return Run(
        name=name,
        mode=mode,
        flow=flow,
        result=res,
        peak_rss=peak,
        rss_timeline=tl,
        capacity_bytes=capacity,
        client_bound=bound,
        goal=goal,
        met=peak <= goal,
        max_poll_exceeded=int(events.get("max_poll_interval_exceeded", 0)),
        rebalance_ok=rebalance_ok,
    )


def report(runs: list[Run]) -> str:
    rows = []
    for r in runs:
        res = r.result
        st = res.get("stats", {})
        rows.append(
            [
                r.name,
                f"{res['processed']:,}" + (" (cut)" if res["cut"] else ""),
                f"{res['drain_seconds']:.1f}",
                fmt_rate(res["rate"]),
                mib(res["baseline_rss"]),
                mib(r.peak_rss),
                mib(r.peak_rss - res["baseline_rss"]),
                "-" if r.capacity_bytes is None else mib(r.capacity_bytes),
                f"{mib(res['queued_max_messages_kbytes'] * 1024)}+{mib(res['fetch_max_bytes'])}",
                mib(r.goal),
                "yes" if r.met else "NO",
                "-" if not st else f"{st['peak_in_flight']:,}",
                "-" if not st else mib(st["peak_in_flight_bytes"]),
                "-" if not st else st["throttles"],
                "-" if not st else st["rebalances"],
                r.max_poll_exceeded,
            ]
        )
    header = [
        "run",
        "processed",
        "drain s",
        "rec/s",
        "baseline RSS",
        "peak RSS",
        "peak - baseline",
        "capacity_bytes",
        "client bound (queued+fetch)",
        "goal",
        "goal met",
        "peak in-flight",
        "peak in-flight MiB",
        "throttles",
        "rebalances",
        "max.poll exceeded",
    ]
    return table(rows, header) + "\n(sizes in MiB)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_broker_args(p)
    p.add_argument("--quick", action="store_true", help="100k records, shorter cut-offs")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--value-size", type=int, default=1024)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--sleep-ms", type=float, default=0.2, help="handler time per record")
    p.add_argument(
        "--runs",
        default="weir/bytes,weir/default,raw",
        help="comma-separated: weir/bytes, weir/default, raw",
    )
    p.add_argument("--max-seconds", type=float, default=150.0, help="cut-off for weir/bytes")
    p.add_argument(
        "--short-seconds", type=float, default=45.0, help="cut-off for weir/default and raw"
    )
    # Child-process plumbing.
    p.add_argument("--child", choices=["weir", "raw"], help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--flow", default="bytes", choices=list(FLOWS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick and not args.child:
        args.records = min(args.records, 100_000)
        args.max_seconds = min(args.max_seconds, 60.0)
        args.short_seconds = min(args.short_seconds, 20.0)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args)
        return 0
    runs = [r for r in args.runs.split(",") if r]
    env = environment()
    print(
        f"# backpressure: {args.records:,} x {args.value_size} B, {args.partitions} partitions, "
        f"handler sleep {args.sleep_ms} ms on {args.workers} workers; cpus={env['cpus']} "
        f"loadavg={env['loadavg_at_start'][0]:.1f}",
        flush=True,
    )
    quiet_logging()
    results: list[Run] = []
    with broker_from(args) as bk:
        topic = unique("bench-backlog")
        create_topic(bk.bootstrap, topic, args.partitions)
        try:
            secs = produce(
                bk.bootstrap,
                topic,
                args.records,
                value_size=args.value_size,
                partitions=args.partitions,
                keys=args.keys,
            )
            print(
                f"# produced {args.records:,} records "
                f"({mib(args.records * args.value_size)} MiB) in {secs:.1f}s",
                flush=True,
            )
            for name in runs:
                mode, _, flow = name.partition("/")
                if mode not in ("weir", "raw"):
                    raise SystemExit(f"unknown run {name!r}")
                flow = flow or "bytes"
                cut = args.max_seconds if name == "weir/bytes" else args.short_seconds
                res, peak, tl = spawn(args, bk.bootstrap, topic, mode, flow, cut)
                run = evaluate(name, mode, flow, res, peak, tl)
                results.append(run)
                print(
                    f"  {name:<13} {res['processed']:>9,} rec in {res['drain_seconds']:.1f}s "
                    f"({fmt_rate(res['rate'])}/s){' CUT' if res['cut'] else ''}: "
                    f"RSS {mib(res['baseline_rss'])} -> peak {mib(peak)} MiB "
                    f"(goal {mib(run.goal)} MiB)",
                    flush=True,
                )
        finally:
            if args.bootstrap:
                delete_topics(bk.bootstrap, [topic])

    print()
    print(report(results))
    for r in results:
        if r.mode == "weir":
            ev = {k: v for k, v in r.result["log_events"].items() if k != "consumer_started"}
            print(
                f"{r.name}: rebalances == 1 (initial assignment only): {r.rebalance_ok}; "
                f"max_poll_interval_exceeded: {r.max_poll_exceeded}; "
                f"engine warnings: {ev or 'none'}"
            )
    write_json(
        args.json,
        {
            "benchmark": "backpressure",
            "environment": env,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "result")},
            "slack_bytes": SLACK,
            "runs": [dataclasses.asdict(r) for r in results],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
