"""The manual as a site: `mkdocs build --strict` passes on the real docs and fails on a broken one.

MkDocs' own build, as `make docs` runs it (mkdocs.yml, strict), in this process and
into a temporary directory: the suite never writes site/. A broken copy is the
real docs (mkdocs.yml, README.md as the home page, docs/ and the hook) with one
thing broken.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from mkdocs.commands.build import build
from mkdocs.config import load_config
from mkdocs.exceptions import Abort

# What the site is built from, relative to the repo.
SOURCES = ("mkdocs.yml", "README.md", "docs", "scripts/docs_front_page.py")


@pytest.fixture(autouse=True)
def _quiet_material(monkeypatch):
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # its end-of-life banner, at every build


def build_site(root: Path, site_dir: Path) -> None:
    """`mkdocs build --strict` of root/mkdocs.yml into site_dir; raises Abort on a warning."""
    build(load_config(config_file=str(root / "mkdocs.yml"), strict=True, site_dir=str(site_dir)))


def test_the_docs_build_strict(tmp_path):
    build_site(REPO, tmp_path)
    assert (tmp_path / "index.html").is_file()  # README.md, the home page
    pages = [p.relative_to(REPO / "docs").with_suffix("") for p in (REPO / "docs").rglob("*.md")]
    for page in pages:
        assert (tmp_path / page / "index.html").is_file(), page
    # The front page's links into docs/ lead to the site's pages.
    home = (tmp_path / "index.html").read_text()
    assert 'href="docs/' not in home


@pytest.fixture
def docs_copy(tmp_path) -> Path:
    """A copy of what the site is built from, to break."""
    root = tmp_path / "repo"
    for source in SOURCES:
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, root / source)
        else:
            (root / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, root / source)
    return root


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _add_to_nav(config: Path, entry: dict) -> None:
    settings = yaml.safe_load(config.read_text())
    settings["nav"].append(entry)
    config.write_text(yaml.safe_dump(settings))


def _a_page(root: Path) -> Path:
    pages = sorted((root / "docs").rglob("*.md"))
    return pages[0] if pages else root / "README.md"


# Each names its own file or heading: all are made in one copy, and each must be found.
BREAKAGES = {
    "a link to a page that does not exist": (
        lambda root: _append(_a_page(root), "\nSee [the old page](no-such-page.md).\n"),
        "no-such-page.md",
    ),
    "a link to a heading that does not exist": (
        lambda root: _append(_a_page(root), "\nSee [resuming](#no-such-heading).\n"),
        "#no-such-heading",
    ),
    "a front-page link into docs/ that does not exist": (
        lambda root: _append(root / "README.md", "\n[Gone](docs/gone.md)\n"),
        "gone.md",
    ),
    "a page the nav names that does not exist": (
        lambda root: _add_to_nav(root / "mkdocs.yml", {"Gone": "never-written.md"}),
        "never-written.md",
    ),
}


def test_a_broken_docs_fails_the_build_naming_each_breakage(docs_copy, tmp_path, caplog):
    """Every breakage at once, in one build (a build takes seconds): strict mode counts the
    warnings and aborts after the whole build, so each breakage's own warning means that
    breakage alone fails it."""
    for break_it, _ in BREAKAGES.values():
        break_it(docs_copy)
    caplog.set_level(logging.WARNING, logger="mkdocs")
    with pytest.raises(Abort, match="strict mode"):
        build_site(docs_copy, tmp_path / "site")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    for breakage, (_, named) in BREAKAGES.items():
        assert any(named in warning for warning in warnings), (breakage, warnings)
