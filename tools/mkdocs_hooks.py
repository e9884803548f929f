"""MkDocs hooks for the site (mkdocs.yml): the repository's README.md is its home page, and a
link out of docs/ (an example's README, the benchmarks) is named as a path in the repository.

The pages are written to read well on a repository browser first: docs/README.md is the index
there, and the pages link to ../examples/... The site has no page for those files and no public
repository URL to send a reader to yet, so such a link becomes the path as text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

# [text](../path#anchor) out of docs/ (any depth), and in README.md [text](path) to a file that
# is not under docs/. Absolute URLs and in-page anchors are left alone.
_OUT_OF_DOCS = re.compile(r"\[([^\]]+)\]\((?:\.\./)+([^)#\s]+)(?:#[^)\s]*)?\)")
_README_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|#)([^)\s]+)\)")


def _as_repository_path(match: re.Match[str]) -> str:
    text, path = match.group(1), match.group(2)
    if text.strip("`") == path:
        return f"`{path}` (in the repository)"
    return f"{text} (`{path}` in the repository)"


def _readme_link(match: re.Match[str]) -> str:
    text, target = match.group(1), match.group(2)
    if target.startswith("docs/"):
        rest = target.removeprefix("docs/")
        return f"[{text}]({'index.md' if rest.startswith('README.md') else rest})"
    return _as_repository_path(match)


def on_files(files: Files, config: Any) -> Files:
    """The home page is README.md at the repository root; docs/README.md (the index on a
    repository browser) would be a second index, and is left out of the site."""
    readme = files.get_file_from_path("README.md")
    if readme is not None:
        files.remove(readme)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=_README_LINK.sub(_readme_link, text)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    # A page's depth under docs/: reference/weir.md's ../configuration.md stays in the site.
    depth = page.file.src_uri.count("/")

    def out_of_docs(match: re.Match[str]) -> str:
        ups = match.group(0).count("../")
        return _as_repository_path(match) if ups > depth else match.group(0)

    return _OUT_OF_DOCS.sub(out_of_docs, markdown)


# Each reference page and the modules whose `__all__` it must show in full.
REFERENCE = {
    "reference-weir": "weir",
    "reference-testing": "weir.testing",
    "reference-fencing": "weir.fencing",
}


_IN_PAGE = re.compile(r'href="#([^"]+)"')
_SENT_TO_CONFIGURATION: set[str] = set()


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    """The settings' descriptions are written for docs/configuration.md (its table is rendered
    from them), where ``[below](#ids-and-names)`` is a section of that page: on a reference page
    such a link goes to configuration.md. on_post_build checks those sections exist."""
    if page.file.src_uri.removesuffix(".md") not in REFERENCE:
        return html
    ids = set(re.findall(r'id="([^"]+)"', html))

    def to_configuration(match: re.Match[str]) -> str:
        anchor = match.group(1)
        if anchor in ids:
            return match.group(0)
        # mkdocstrings prefixes a docstring's anchors with its object's path.
        anchor = re.sub(r"^weir\.[\w.]+--", "", anchor)
        _SENT_TO_CONFIGURATION.add(anchor)
        return f'href="../configuration/#{anchor}"'

    return _IN_PAGE.sub(to_configuration, html)


def on_post_build(config: Any) -> None:
    """A public name without its entry on the reference page fails the build: mkdocstrings
    leaves out, without a warning, a name it cannot resolve. So does a link on_page_content
    sent to a section configuration.md does not have."""
    import importlib

    from mkdocs.exceptions import PluginError

    site = Path(config["site_dir"])
    configuration = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    missing_sections = sorted(a for a in _SENT_TO_CONFIGURATION if f'id="{a}"' not in configuration)
    if missing_sections:
        raise PluginError(f"links to sections configuration.md lacks: {missing_sections}")
    for page, module in REFERENCE.items():
        html = (site / page / "index.html").read_text(encoding="utf-8")
        names = importlib.import_module(module).__all__
        missing = [n for n in names if f'id="{module}.{n}"' not in html]
        if missing:
            raise PluginError(f"{page}.md does not show {module}.{', '.join(missing)}")
