"""examples/dead_letter end to end on the session's broker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.example_runs import run_passing

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "examples" / "dead_letter" / "README.md"


def readme_output() -> list[str]:
    """The lines of the output the README shows: its fenced block without a language."""
    blocks: list[tuple[str, list[str]]] = []
    inside = False
    for line in README.read_text().splitlines():
        fence = line.strip()
        if fence.startswith("```"):
            inside = not inside
            if inside:
                blocks.append((fence.removeprefix("```"), []))
        elif inside:
            blocks[-1][1].append(line)
    [output] = [lines for language, lines in blocks if language == ""]
    return output


@pytest.mark.timeout(120)
def test_the_dead_letter_example_passes(kafka_bootstrap: str) -> None:
    lines = run_passing("examples.dead_letter", kafka_bootstrap)
    output = "\n".join(lines)
    assert "charged              291  ok" in lines, output
    assert "dead-lettered        9 of 9 poison  ok" in lines, output
    assert "retried              42 (payment service timeouts)" in lines, output
    assert sum("DeserializationError" in line for line in lines) == 3, output
    assert sum("InvalidOrder" in line for line in lines) == 6, output
    # What it prints is what its README shows: nothing on stderr (regression: a dead_lettered
    # warning per poison record; `run_passing` checks it), and the README's lines that do not
    # vary from run to run.
    shown = readme_output()
    steady = [
        line
        for line in shown
        if not line.startswith(("  [", "  ...", "elapsed", "starting embedded Kafka"))
    ]
    assert len(steady) == 7, (
        shown
    )  # produced, charged, twice, retried, dead-lettered, committed, PASS
    assert [line for line in lines if line in steady] == steady, output
    # Each dead letter's line has the README's shape.
    letters = [line for line in lines if line.startswith("  [")]
    assert len(letters) == 9
    for line in letters:
        assert re.fullmatch(
            r"  \[\d\]@\d+ +1 attempt  (InvalidOrder|DeserializationError): .+", line
        )
