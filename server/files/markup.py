"""The inline markup a file's text travels in: formatting runs and fixed pieces as tags the server keeps.

A paragraph of a document becomes one segment of HTML-like markup: its text escaped, each run
whose formatting differs from the paragraph's usual one wrapped in `<gN>…</gN>`, and each piece
that is not text (an image, a tab, a field, a bookmark, a footnote reference) standing as an
empty `<xN/>`. The segment is translated as text/html: the server's markup planner
(server/texts/html.py) treats unknown elements as inline, so each sentence is translated
without them and every tag comes back exactly once, in order, well nested, at the same relative
word position (docs/documents.md). `parse` reads the translation back into a tree of text, groups
and atoms, from which each format puts its runs back together.

Line breaks inside a text are either block breaks (`<br/>`: each line translated on its own, as
in a PO message's "\\n") or inline atoms (`<n/>`: the break travels with the sentence, as in a
subtitle's two lines); a tab is always the atom `<t/>`.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Union

_TOKEN = re.compile(r"<(/?)([gx])(\d+)(/?)>|<br/>|<n/>|<t/>|<[^>]*>")


@dataclass
class Atom:
    id: int


@dataclass
class Group:
    id: int
    children: list["Node"] = field(default_factory=list)


Node = Union[str, Atom, Group]


class Builder:
    """Writes one segment: `text`, `open`/`close` of a group, `atom`; ids are the caller's."""

    def __init__(self, newline: str = "br"):
        self.parts: list[str] = []
        self.newline = "<br/>" if newline == "br" else "<n/>"
        self.plain: list[str] = []  # the text alone: what is billed, what language detection reads

    def text(self, text: str) -> None:
        if not text:
            return
        self.plain.append(text)
        escaped = html.escape(text.replace("\r\n", "\n"), quote=False)
        self.parts.append(escaped.replace("\n", self.newline).replace("\t", "<t/>"))

    def open(self, ident: int) -> None:
        self.parts.append(f"<g{ident}>")

    def close(self, ident: int) -> None:
        self.parts.append(f"</g{ident}>")

    def atom(self, ident: int) -> None:
        self.parts.append(f"<x{ident}/>")

    def markup(self) -> str:
        return "".join(self.parts)

    def has_text(self) -> bool:
        return any(t.strip() for t in self.plain)


def escape(text: str, newline: str = "br") -> str:
    b = Builder(newline)
    b.text(text)
    return b.markup()


def parse(markup: str) -> list[Node]:
    """The translation of a segment as a tree. Tolerant: an end tag closes the nearest open group of
    its id (groups left open are closed at the end), a stray end tag or an unknown tag is dropped,
    and entities are decoded."""
    root: list[Node] = []
    stack: list[tuple[int, list[Node]]] = [(-1, root)]
    pos = 0

    def add_text(raw: str) -> None:
        if raw:
            text = html.unescape(raw)
            siblings = stack[-1][1]
            if siblings and isinstance(siblings[-1], str):
                siblings[-1] += text
            else:
                siblings.append(text)

    for m in _TOKEN.finditer(markup):
        add_text(markup[pos:m.start()])
        pos = m.end()
        token = m.group(0)
        if token in ("<br/>", "<n/>"):
            add_text("\n")
        elif token == "<t/>":
            add_text("\t")
        elif m.group(2) == "x":
            stack[-1][1].append(Atom(int(m.group(3))))
        elif m.group(2) == "g" and m.group(4):  # <g3/>: an empty group
            stack[-1][1].append(Group(int(m.group(3))))
        elif m.group(2) == "g" and not m.group(1):
            group = Group(int(m.group(3)))
            stack[-1][1].append(group)
            stack.append((group.id, group.children))
        elif m.group(2) == "g":
            ident = int(m.group(3))
            at = next((k for k in range(len(stack) - 1, 0, -1) if stack[k][0] == ident), None)
            if at is not None:
                del stack[at:]
    add_text(markup[pos:])
    return root


def ids(nodes: list[Node]) -> tuple[set[int], set[int]]:
    """(group ids, atom ids) present in a tree."""
    groups, atoms, todo = set(), set(), list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, Group):
            groups.add(node.id)
            todo.extend(node.children)
        elif isinstance(node, Atom):
            atoms.add(node.id)
    return groups, atoms


def plain(nodes: list[Node]) -> str:
    """The text of a tree, tags dropped."""
    out = []
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, Group):
            out.append(plain(node.children))
    return "".join(out)


def text_of(markup: str) -> str:
    """The text of a segment (or of its translation): what is billed and what detection reads."""
    return plain(parse(markup))
