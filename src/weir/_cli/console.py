"""How the commands print tables: rich when installed, plain and wide when piped."""

from __future__ import annotations

from typing import Any

from weir._cli.usage import UsageError


def table_console() -> Any:
    try:
        from rich.console import Console
    except ImportError:
        raise UsageError(
            "the table needs rich: pip install 'kafka-weir[cli]' (or use --json)"
        ) from None

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits with 1 itself; main() and `--watch` end quietly with their own codes.
            self.quiet = True
            raise BrokenPipeError

    console = _Console(highlight=False)
    if not console.is_terminal:
        # Piped or captured: no colour, and no column squeezed to an 80-column guess.
        console = _Console(highlight=False, width=1000, no_color=True)
    return console


def number(value: int | None) -> str:
    return "-" if value is None else str(value)
