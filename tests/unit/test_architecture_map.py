"""The house's shape: docs/architecture.md against the tree (its module table names every module of server/
and nothing else; every `.py` the page names still exists), modules of a readable size, and a server/ root
that holds only the entry point and the configuration (every other module lives in the package of its role)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def test_the_module_table_lists_every_module_of_server_and_only_those():
    listed = set(re.findall(r"^\| `(server/[\w/]+\.py)` \|", PAGE.read_text(encoding="utf-8"), re.M))
    tree = {str(p.relative_to(ROOT)) for p in (ROOT / "server").rglob("*.py") if p.name != "__init__.py"}
    assert sorted(tree - listed) == [], "modules missing from docs/architecture.md's table"
    assert sorted(listed - tree) == [], "modules in docs/architecture.md's table that are gone"


def test_every_module_the_page_names_exists():
    # a name is a path from the repository root, or from server/, models/ or server/core/ (the page's shorthand)
    named = set(re.findall(r"[\w./-]*\w\.py\b", PAGE.read_text(encoding="utf-8")))
    gone = sorted(n for n in named if not any((base / n).is_file() for base in
                                                (ROOT, ROOT / "server", ROOT / "models", ROOT / "server" / "core")))
    assert gone == []


MAX_LINES = 400


def test_no_module_of_server_is_over_the_size_one_responsibility_takes():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "server").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_the_server_root_holds_only_the_entry_point_and_the_configuration():
    root = sorted(p.name for p in (ROOT / "server").glob("*.py"))
    assert root == ["__init__.py", "__main__.py", "config.py", "config_help.py"]
