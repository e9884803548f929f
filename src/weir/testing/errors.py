"""Errors raised by the test harness.

Every message says what to do next, because these surface in a user's test run, far from our code.
"""

from __future__ import annotations


class HarnessError(RuntimeError):
    """Base class: anything that prevents the harness from giving a test a broker."""


class JavaNotFoundError(HarnessError):
    """No ``java`` executable."""


class JavaVersionError(HarnessError):
    """``java`` is older than the Kafka version needs."""


class MavenNotFoundError(HarnessError):
    """No ``mvn`` executable and the Kafka jars are not cached yet."""


class MavenError(HarnessError):
    """Maven ran but could not fetch the Kafka jars."""


class PortInUseError(HarnessError):
    """A port the caller asked for is already taken."""


class WorkdirError(HarnessError):
    """A work directory the caller named cannot be created or used."""


class WorkdirInUseError(WorkdirError):
    """Another broker (or cluster) runs on the work directory: it holds the directory's lock."""


class ServerStartError(HarnessError):
    """A server process the harness started exited or did not become ready in time.

    ``log_tail`` carries the last lines of the server's log so the cause shows in the test report
    even after the directory holding the log is removed.
    """

    log_name = "server"

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        if log_tail:
            message = f"{message}\n--- last lines of the {self.log_name} log ---\n{log_tail}"
        super().__init__(message)


class BrokerStartError(ServerStartError):
    """The broker process exited or did not become ready in time."""

    log_name = "broker"


class PostgresNotFoundError(HarnessError):
    """No PostgreSQL server binaries on this machine, and no ``WEIR_POSTGRES_DSN``."""


class PostgresStartError(ServerStartError):
    """``initdb`` or ``postgres`` failed or did not become ready."""

    log_name = "PostgreSQL"


class BrokerUnavailableError(HarnessError):
    """No way to obtain a broker on this machine, or the requested way is misconfigured."""
