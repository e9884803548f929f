"""weir's logging in a fresh interpreter, where no test framework configured logging: weir
changes no global logging state, shows only warnings and errors until the application sets
logging up, and everything once it does."""

from __future__ import annotations

import pytest

from tests.processes import run_python

pytestmark = pytest.mark.timeout(60)


def test_weir_changes_no_global_logging_state() -> None:
    """Importing and using weir neither configures structlog nor adds a handler anywhere; an
    application's own structlog configuration keeps working, and weir's events still go to the
    stdlib loggers."""
    result = run_python(
        """
        import logging, sys
        import structlog
        import weir, weir.cli, weir.testing
        from weir.logs import get_logger
        get_logger("weir.engine").warning("from_weir", n=1)
        assert not structlog.is_configured()
        loggers = [logging.getLogger()] + [
            l for l in logging.root.manager.loggerDict.values() if isinstance(l, logging.Logger)
        ]
        assert not any(l.handlers for l in loggers), [l.name for l in loggers if l.handlers]
        assert all(l.level == logging.NOTSET for l in loggers[1:] if l.name.startswith("weir"))

        structlog.configure(
            logger_factory=structlog.PrintLoggerFactory(sys.stdout),
            processors=[structlog.processors.KeyValueRenderer(key_order=["event"])],
        )
        structlog.get_logger("app").info("from_app", x=2)
        get_logger("weir.engine").warning("from_weir_again", n=3)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "event='from_app' x=2\n"
    # No logging configured: the stdlib's last resort shows warnings, as for any library.
    assert result.stderr == "from_weir n=1\nfrom_weir_again n=3\n"


def test_without_logging_configured_only_warnings_and_errors_show() -> None:
    """With no logging set up, weir printed its debug and info events to stdout."""
    result = run_python(
        """
        from weir.logs import get_logger
        log = get_logger("weir.engine")
        log.debug("commit", tp="t[0]", offset=5)
        log.info("consumer_started", group_id="g")
        log.warning("partitions_lost", partitions=["t[0]"])
        log.error("handler_failed", event_id="t-0-5", error="ValueError()")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "partitions_lost partitions=['t[0]']",
        "handler_failed event_id=t-0-5 error='ValueError()'",
    ]


def test_basic_config_at_debug_shows_every_event_with_its_fields() -> None:
    result = run_python(
        """
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        from weir.logs import get_logger
        get_logger("weir.committing").debug("commit", tp="t[0]", offset=5, sync=False)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == "DEBUG weir.committing: commit tp=t[0] offset=5 sync=False\n"
