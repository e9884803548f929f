"""What a whole run against a broker that cannot be reached prints: one error naming the cause.

Each case runs a GroupConsumer in a child process twice at once: with no logging configured
(what a new user sees) and with `logging.basicConfig(level=WARNING)`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

STARTUP_TIMEOUT_S = 3.0
CHILD = textwrap.dedent(
    """
    import logging, sys
    from weir import GroupConsumer
    if sys.argv[2] == "warning":
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    GroupConsumer(
        lambda record: None,
        bootstrap_servers=sys.argv[1],
        group_id="g",
        topics=["t"],
        startup_timeout_s=float(sys.argv[3]),
    ).run()
    """
)
CASES = {
    # The resolver's own words vary ("Name or service not known", "Temporary failure in name
    # resolution"): the error must carry librdkafka's "Failed to resolve".
    "no-such-host.invalid:9092": r"Failed to resolve 'no-such-host\.invalid:9092': \S.*",
    "127.0.0.1:1": r"Connect to ipv4#127\.0\.0\.1:1 failed: Connection refused",
}
RAW_LIBRDKAFKA = re.compile(r"^%\d\|")  # librdkafka's own stderr format: %3|1700000000.123|FAIL|


def run_both(servers: str) -> dict[str, subprocess.CompletedProcess[str]]:
    procs = {
        mode: subprocess.Popen(
            [sys.executable, "-c", CHILD, servers, mode, str(STARTUP_TIMEOUT_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("none", "warning")
    }
    done = {}
    for mode, proc in procs.items():
        out, err = proc.communicate(timeout=45)
        done[mode] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.parametrize("servers", list(CASES))
def test_an_unreachable_broker_is_one_error_naming_the_cause(servers: str) -> None:
    """Regression: such a run printed ~60 structlog lines to stdout (debug and info among them)
    and a raw librdkafka line to stderr for every retry (about 20 a second), each error again
    as a `kafka_error` warning all stamped with the same second (served at close), and the
    error said only "Broker transport failure"."""
    runs = run_both(servers)
    error = (
        re.escape(
            f"weir.errors.BrokerUnreachableError: no Kafka broker answered at {servers!r} "
            f"within {STARTUP_TIMEOUT_S:g}s (startup_timeout_s): "
        )
        + CASES[servers]
    )
    for mode, run in runs.items():
        assert run.returncode == 1, (mode, run.stderr)
        assert run.stdout == "", mode
        lines = run.stderr.splitlines()
        assert re.fullmatch(error, lines[-1]), (mode, lines[-1])
        # One exception, not a chain ending in "Broker transport failure".
        assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
        assert "Broker transport failure" not in run.stderr
        logged = lines[: lines.index("Traceback (most recent call last):")]
        assert not [line for line in logged if RAW_LIBRDKAFKA.match(line)], logged
        # Nothing below WARNING: no info event (consumer_stopping, consumer_stopped, ...).
        assert not [line for line in logged if "consumer_st" in line], logged
        # The first of each repeated error, then one line with its count.
        assert len(logged) <= 6, logged

    logged = runs["warning"].stderr.splitlines()
    logged = logged[: logged.index("Traceback (most recent call last):")]
    assert all(re.match(r"(WARNING|ERROR|CRITICAL) weir\.", line) for line in logged), logged
    kafka_errors = [line for line in logged if "weir.client_errors: kafka_error " in line]
    assert len(kafka_errors) == 1, logged
    [repeated] = [
        line for line in logged if "weir.client_errors: error_repeated of=kafka_error" in line
    ]
    m = re.search(r" count=(\d+) first=(\S+) last=(\S+) ongoing=False$", repeated)
    assert m is not None, repeated
    # librdkafka retries about every 50 ms: dozens in 3 s, collapsed into one line.
    assert int(m.group(1)) >= 10 and m.group(2) < m.group(3), repeated
    fails = [line for line in logged if line.startswith("ERROR weir.librdkafka: FAIL ")]
    assert len(fails) == 2 and "(repeated " not in fails[0], logged
    assert re.search(r" \(repeated \d+ times from \S+ to \S+\)$", fails[1]), fails[1]
