"""HTML that nobody here wrote: pages made by the generators people use, from text people wrote.

- Python's difflib.HtmlDiff (a side-by-side table: every cell `&nbsp;`-spaced, spans inside cells),
  over 200 test captions and an edited copy of them;
- pydoc's HTML pages for standard-library modules (tables of `&nbsp;` spacers, nested markup);
- the `markdown` library and docutils over the long descriptions that installed packages ship
  in their metadata (their authors' README files, Markdown and reStructuredText).

`skeleton()` is what must survive translation: every tag with its attributes, every comment,
declaration and processing instruction, in order.
"""
from __future__ import annotations

import difflib
import html.parser
import importlib
import importlib.metadata
import pydoc

PYDOC_MODULES = ["textwrap", "colorsys", "fnmatch", "bisect", "shlex", "glob"]
MARKDOWN_PACKAGES = ["numpy", "idna", "attrs", "tokenizers", "onnx", "huggingface_hub", "Jinja2", "click",
                     "pillow", "fsspec", "MarkupSafe", "typing_extensions"]
RST_PACKAGES = ["pytest", "packaging", "grpcio", "pluggy", "jsonschema", "pyparsing", "cryptography",
                "python-dateutil", "iniconfig", "setuptools", "pip", "networkx"]
MAX_CHARS = 12_000  # a README longer than this is cut at a paragraph (the test is about markup, not volume)


def skeleton(markup: str) -> list[tuple]:
    found: list[tuple] = []

    class Collect(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append(("start", tag, tuple(attrs)))

        def handle_startendtag(self, tag, attrs):
            found.append(("startend", tag, tuple(attrs)))

        def handle_endtag(self, tag):
            found.append(("end", tag))

        def handle_comment(self, data):
            found.append(("comment", data))

        def handle_decl(self, decl):
            found.append(("decl", decl))

        def handle_pi(self, data):
            found.append(("pi", data))
    parser = Collect()
    parser.feed(markup)
    parser.close()
    return found


def htmldiff_pages(lines: list[str]) -> list[tuple[str, str]]:
    """A full HtmlDiff file of 200 lines against an edited copy, and two context tables."""
    edited = []
    for i, line in enumerate(lines):
        if i % 17 == 3:
            edited.append(line.upper())  # the example: a changed line, all capitals
        elif i % 23 == 5:
            continue  # deleted
        elif i % 29 == 7:
            edited += [line, "An added line, " + line[0].lower() + line[1:]]
        else:
            edited.append(line)
    diff = difflib.HtmlDiff(wrapcolumn=None)
    return [("htmldiff-file", diff.make_file(lines, edited, "before", "after")),
            ("htmldiff-context", diff.make_table(lines[:80], edited[:80], context=True, numlines=2)),
            ("htmldiff-wrapped", difflib.HtmlDiff(wrapcolumn=40).make_table(lines[:30], edited[:30]))]


def pydoc_pages() -> list[tuple[str, str]]:
    doc = pydoc.HTMLDoc()
    return [(f"pydoc-{name}", doc.page(name, doc.document(importlib.import_module(name))))
            for name in PYDOC_MODULES]


def _description(package: str, content_type: str) -> str | None:
    try:
        meta = importlib.metadata.metadata(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if not (meta.get("Description-Content-Type") or "").startswith(content_type):
        return None
    text = meta.get_payload() or meta.get("Description") or ""
    if len(text) < 1000:
        return None
    cut = text.rfind("\n\n", 0, MAX_CHARS)
    return text if len(text) <= MAX_CHARS else text[:cut]


def markdown_pages() -> list[tuple[str, str]]:
    import markdown
    out = []
    for package in MARKDOWN_PACKAGES:
        text = _description(package, "text/markdown")
        if text:
            out.append((f"markdown-{package}", markdown.markdown(text, extensions=["tables", "fenced_code"])))
    return out


def rst_pages() -> list[tuple[str, str]]:
    from docutils.core import publish_string
    out = []
    for package in RST_PACKAGES:
        text = _description(package, "text/x-rst")
        if text:
            page = publish_string(text, writer="html5", settings_overrides={
                "report_level": 5, "halt_level": 5, "output_encoding": "unicode", "embed_stylesheet": False})
            out.append((f"rst-{package}", page))
    return out


def corpus(lines: list[str]) -> list[tuple[str, str]]:
    return htmldiff_pages(lines) + pydoc_pages() + markdown_pages() + rst_pages()
