"""The public API's breaking changes since the last release (griffe), each acknowledged or failing.

    python tools/api_check.py                 # list them; fail on one not in api/breaking.txt
    python tools/api_check.py --acknowledge   # write the current list to api/breaking.txt
    python tools/api_check.py --baseline REF  # a release: REF's API becomes api/baseline.json

The baseline is a committed griffe dump of the released package (api/baseline.json), not a git
ref: CI's clone may have no tags or no history, and 0.1.0 was never tagged. A breaking change is
acknowledged once it is listed in api/breaking.txt, which is also where the changelog's
"Changed (breaking)" section is checked against by hand (api/README.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "api" / "baseline.json"
ACKNOWLEDGED = ROOT / "api" / "breaking.txt"


def _without_docstrings(data: Any) -> Any:
    """Docstrings cannot break a caller, and are most of a dump's size."""
    if isinstance(data, dict):
        return {k: _without_docstrings(v) for k, v in data.items() if k != "docstring"}
    if isinstance(data, list):
        return [_without_docstrings(v) for v in data]
    return data


def write_baseline(ref: str) -> None:
    api = griffe.load_git("weir", ref=ref, repo=ROOT, search_paths=["src"])
    data = json.loads(json.dumps(api, cls=griffe.JSONEncoder, full=False))
    BASELINE.write_text(json.dumps(_without_docstrings(data), indent=None) + "\n")
    print(f"{BASELINE.relative_to(ROOT)}: the API of weir at {ref}")


def load_baseline() -> griffe.Module:
    module = json.loads(BASELINE.read_text(), object_hook=griffe.json_decoder)
    # A decoded module belongs to no collection, and griffe resolves the aliases (names
    # imported from another module) through one.
    collection = griffe.ModulesCollection()
    collection.set_member("weir", module)
    module._modules_collection = collection
    assert isinstance(module, griffe.Module)
    return module


def breaking_changes() -> list[str]:
    new = griffe.load("weir", search_paths=[ROOT / "src"])
    found = []
    for breakage in griffe.find_breaking_changes(load_baseline(), new):
        # "src/weir/records.py:91: Record: ..." without the line, which moves with every edit.
        plain = re.sub(r"\x1b\[[0-9;]*m", "", breakage.explain())  # without its colours
        found.append(re.sub(r"^([^:]+):\d+: ", r"\1: ", plain))
    return sorted(set(found))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--acknowledge", action="store_true")
    parser.add_argument("--baseline", metavar="REF")
    args = parser.parse_args(argv)
    if args.baseline:
        write_baseline(args.baseline)
        return 0
    found = breaking_changes()
    if args.acknowledge:
        ACKNOWLEDGED.write_text("".join(f"{line}\n" for line in found))
        print(f"{ACKNOWLEDGED.relative_to(ROOT)}: {len(found)} breaking changes acknowledged")
        return 0
    listed = set(ACKNOWLEDGED.read_text().splitlines()) if ACKNOWLEDGED.exists() else set()
    new = [line for line in found if line not in listed]
    gone = sorted(listed - set(found))
    print(f"breaking changes of the public API since the baseline: {len(found)}")
    for line in found:
        print(f"  {'NEW ' if line in new else ''}{line}")
    if gone:
        print(f"listed in {ACKNOWLEDGED.relative_to(ROOT)} but no longer found (remove them):")
        print("".join(f"  {line}\n" for line in gone), end="")
    if new:
        print(
            f"{len(new)} not acknowledged: say each in CHANGELOG.md under 'Changed (breaking)', "
            f"then run python tools/api_check.py --acknowledge (api/README.md)"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
