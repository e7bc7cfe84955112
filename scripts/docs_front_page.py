"""MkDocs hook (mkdocs.yml `hooks:`): README.md is the site's home page as well as the repo's.

One text for both: the site gets README.md as a generated `index.md`, its links
into docs/ made relative to the site (`docs/checkpoints.md` -> `checkpoints.md`).
Every other link stays as written, so strict mode checks the front page's links
as it checks every page's (a link to a file outside docs/ fails the build).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

# `](docs/x.md)` inline, `[label]: docs/x.md` as a reference definition.
_INTO_DOCS = re.compile(r"(\]\(|^\[[^\]]+\]:[ \t]*)docs/", re.MULTILINE)


def front_page(readme: str) -> str:
    """README.md's text with its links into docs/ as the site's home page needs them."""
    return _INTO_DOCS.sub(r"\1", readme)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    if files.get_file_from_path("index.md") is not None:
        raise PluginError("docs/index.md would hide README.md, the site's home page: remove it")
    readme = Path(config.config_file_path).parent / "README.md"
    files.append(File.generated(config, "index.md", content=front_page(readme.read_text())))
    return files
