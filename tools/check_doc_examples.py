"""Type-check every Python block of README.md and docs/*.md with mypy --strict, in one run.

Each ```python block is written to a module of its own in a temporary directory, and mypy checks
them all at once with the project's settings (pyproject.toml: strict, the pydantic plugin, the
overrides for untyped libraries). A block that is not a whole program (a method body, a line
showing a call) says so in its info string, ```python title="fragment", and is left out; the
site shows that title above it. `make typecheck` (so `make test`) runs this.

Usage: python tools/check_doc_examples.py [--list]
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
FRAGMENT = 'title="fragment"'


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    info: str
    code: str

    @property
    def python(self) -> bool:
        words = self.info.split()
        return bool(words) and words[0] in ("python", "py")

    @property
    def fragment(self) -> bool:
        return FRAGMENT in self.info

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        found.append(Block(page, i + 1, opening["info"].strip(), "\n".join(body) + "\n"))
        i = j + 1
    return found


def main(argv: list[str]) -> int:
    from mypy import api

    every = [b for page in PAGES for b in blocks(page) if b.python]
    # A block that only includes a file (pymdownx.snippets) is that file: mypy checks it there.
    included = [b for b in every if b.code.lstrip().startswith("--8<--")]
    fragments = [b for b in every if b.fragment]
    checked = [b for b in every if b not in included and b not in fragments]
    if "--list" in argv:
        for b in every:
            kind = "fragment" if b in fragments else "included" if b in included else "checked"
            print(f"{kind:9} {b.where}")
    # mypy stops at the first syntax error: name every block that is not Python at once.
    unparsed = []
    for block in checked:
        try:
            compile(block.code, block.where, "exec", dont_inherit=True)
        except SyntaxError as exc:
            unparsed.append(
                f"{block.page.relative_to(ROOT)}:{block.line + (exc.lineno or 0)}: "
                f"not Python ({exc.msg}): fix it, or mark it {FRAGMENT}"
            )
    if unparsed:
        print("\n".join(unparsed))
        return 1
    with tempfile.TemporaryDirectory(prefix="weir-doc-examples-") as tmp:
        where: dict[str, str] = {}
        for n, block in enumerate(checked):
            name = f"example_{n:03d}.py"
            (Path(tmp) / name).write_text(block.code, encoding="utf-8")
            where[name] = block.where
        out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), tmp])
        for line in (out + err).splitlines():
            name = Path(line.split(":", 1)[0]).name
            if name in where:  # example_007.py:3: error ... -> docs/page.md:41 (+3)
                _, lineno, rest = line.split(":", 2)
                block_line = where[name].rsplit(":", 1)
                print(f"{block_line[0]}:{int(block_line[1]) + int(lineno)}:{rest}")
            else:
                print(line)
    print(
        f"doc examples: {len(checked)} Python blocks type-checked (mypy --strict), "
        f"{len(included)} included from files mypy checks there, {len(fragments)} marked "
        f"{FRAGMENT}, of {len(every)} in README.md and docs/"
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
