"""tools/check_doc_examples.py finds the Python blocks of a page as a reader sees them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_doc_examples.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_doc_examples", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


PAGE = """# A page

```python
import weir
```

- a list item with a block:

  ```python title="fragment"
  consumer.stop()
  ```

````markdown
```python
not_a_block_of_this_page()
```
````

```console
$ weir --version
```
"""


def test_blocks_are_found_with_their_line_fragment_mark_and_indentation(tmp_path: Path) -> None:
    tool = _tool()
    page = tmp_path / "page.md"
    page.write_text(PAGE, encoding="utf-8")
    python = [b for b in tool.blocks(page) if b.python]
    assert [(b.line, b.fragment, b.code) for b in python] == [
        (3, False, "import weir\n"),
        (9, True, "consumer.stop()\n"),  # the list item's indentation is not Python's
    ]


def test_every_python_block_of_the_docs_is_checked_or_marked() -> None:
    tool = _tool()
    every = [b for page in tool.PAGES for b in tool.blocks(page) if b.python]
    assert len(every) > 30  # README.md and docs/ were read at all
    for block in every:
        if not block.fragment and not block.code.lstrip().startswith("--8<--"):
            compile(block.code, block.where, "exec", dont_inherit=True)
