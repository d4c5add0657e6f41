"""gettext catalogues (.po, .pot) through polib: every entry's msgid translated into its msgstr.

Entries keep their context, comments, references, flags (fuzzy, python-format...) and order; the
header keeps every field but Language, which names the target. A plural entry's msgid fills
msgstr[0] and its msgid_plural every other form (the forms the entry already had, or [0] and [1]);
obsolete entries (#~) are left alone. Format placeholders (%s, %(name)s, {0}) and tags come back
exactly once (the server's placeholder rule, docs/documents.md); a "\\n" inside a message is a line
break that stays where it is (each line is translated on its own).

polib.pofile() takes a path or the contents and opens a file when the contents name one that
exists: an upload reading "/etc/passwd" must not read the server's file, so the upload is
written to a private temporary file and polib is given that file's path.
"""
from __future__ import annotations

import os
import re
import tempfile

from server.files import Document
from server.files.checks import FileError, Limits, decode_text
from server.files.markup import escape, text_of


def read_po(data: bytes, limits: Limits) -> Document:
    import polib
    decode_text(data, "po")  # UTF-8 text, not another file type
    with tempfile.TemporaryDirectory(prefix="nmt-po-") as folder:
        path = os.path.join(folder, "upload.po")
        with open(path, "wb") as f:
            f.write(data)
        catalogue = polib.pofile(path, encoding="utf-8-sig" if data.startswith(b"\xef\xbb\xbf") else "utf-8",
                                 check_for_duplicates=False, wrapwidth=78)
    if not len(catalogue) and not catalogue.metadata:
        raise FileError("Invalid file data: the po file holds no entry")
    found = re.search(r"nplurals\s*=\s*(\d+)", catalogue.metadata.get("Plural-Forms", ""))
    nplurals = min(int(found.group(1)), 10) if found and int(found.group(1)) >= 1 else 2
    segments, places = [], []  # places[i]: (entry, plural forms or None, is the plural source)
    for entry in catalogue:
        if entry.obsolete or not entry.msgid:
            continue
        if entry.msgid_plural:
            forms = sorted(entry.msgstr_plural) or list(range(nplurals))
            for plural, source in enumerate((entry.msgid, entry.msgid_plural)):
                if source.strip():
                    segments.append(escape(source))
                    places.append((entry, forms, bool(plural)))
        elif entry.msgid.strip():
            segments.append(escape(entry.msgid))
            places.append((entry, None, False))

    def rebuild(translations: list[str], target: str) -> bytes:
        for (entry, forms, plural), translation in zip(places, translations):
            out = text_of(translation)
            if forms is None:
                entry.msgstr = out
                continue
            for k in forms:
                if (k == 0) != plural:  # msgid -> form 0, msgid_plural -> the others
                    entry.msgstr_plural[k] = out
        if target and catalogue.metadata:
            catalogue.metadata["Language"] = target
        out = str(catalogue)
        if not catalogue.header and out.startswith("#\n"):  # polib writes an empty header comment as "#"
            out = out[2:]
        return out.encode("utf-8")
    return Document(segments, rebuild)
