"""The operations kit: Prometheus alert rules and a Grafana dashboard for weir's metrics.

Both ship inside the package, so a wheel install has them:

    python -m weir.ops                      # lists them, with their paths
    python -m weir.ops alerts > weir-alerts.yml
    python -m weir.ops dashboard > weir-dashboard.json

What each alert means and what to do when it fires: docs/operating.md. The metrics they read are
`weir.prometheus`'s (docs/observability.md); a unit test checks every name they use against what
the collector exports.
"""

from __future__ import annotations

import sys
from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

__all__ = ["FILES", "path", "read"]

FILES: dict[str, str] = {
    "alerts": "weir-alerts.yml",
    "dashboard": "weir-dashboard.json",
}
"""What `python -m weir.ops NAME` prints: the name's file in this package."""


def path(name: str) -> Traversable:
    """The shipped file `name` names ("alerts" or "dashboard")."""
    if name not in FILES:
        raise ValueError(f"no ops file {name!r}: one of {', '.join(FILES)}")
    return files(__name__).joinpath(FILES[name])


def read(name: str) -> str:
    """The text of the shipped file `name` names ("alerts" or "dashboard")."""
    return path(name).read_text(encoding="utf-8")
