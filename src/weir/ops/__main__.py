"""`python -m weir.ops [alerts|dashboard]`: print a shipped file, or list them."""

from __future__ import annotations

import sys

from weir.ops import FILES, path, read

USAGE = "usage: python -m weir.ops [alerts|dashboard]\n"


def main(argv: list[str]) -> int:
    if not argv:
        for name, file in FILES.items():
            sys.stdout.write(f"{name:<10} {file:<20} {path(name)}\n")
        return 0
    if len(argv) > 1 or argv[0] not in FILES:
        sys.stderr.write(USAGE)
        return 2
    sys.stdout.write(read(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
