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


class BrokerStartError(HarnessError):
    """The broker process exited or did not become ready in time.

    ``log_tail`` carries the last lines of the broker's log so the cause shows in the test report
    even after the work directory is removed.
    """

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        if log_tail:
            message = f"{message}\n--- last lines of the broker log ---\n{log_tail}"
        super().__init__(message)


class BrokerUnavailableError(HarnessError):
    """No way to obtain a broker on this machine, or the requested way is misconfigured."""
