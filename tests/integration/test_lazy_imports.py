"""What importing weir's modules loads, in a fresh interpreter: the CLI leaves the admin and
rendering code alone until a command needs it, and `weir.testing` the fake until it is used."""

from __future__ import annotations

import pytest

from tests.processes import run_python

pytestmark = pytest.mark.timeout(60)


def test_cli_import_leaves_the_admin_and_render_code_alone() -> None:
    # (`import weir` already brings confluent_kafka, and structlog brings parts of rich.)
    lazy = "{'weir.lag', 'confluent_kafka.admin', 'rich.live', 'weir.testing.broker'}"
    result = run_python(f"import sys, weir.cli; print(sorted({lazy} & set(sys.modules)))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_importing_weir_testing_does_not_import_the_fake() -> None:
    result = run_python(
        """
        import sys, weir.testing as t
        assert not {'weir.testing.fake', 'weir.testing.fake_broker'} & set(sys.modules)
        assert t.FakeBroker is __import__('weir.testing.fake', fromlist=['x']).FakeBroker
        """
    )
    assert result.returncode == 0, result.stderr


def test_a_member_without_tracing_never_imports_opentelemetry() -> None:
    """Tracing off costs nothing: no wrapper, and neither weir.tracing nor OpenTelemetry (which
    the test extra installs) loaded."""
    code = (
        "import sys; from weir import GroupConsumer; "
        "GroupConsumer(lambda r: None, bootstrap_servers='x:1', group_id='g', topics=['t']); "
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'weir.tracing'))))"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
