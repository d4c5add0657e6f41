"""Document files (issue 36): every format round-trips through DeepL's official client, bad and hostile
files and form bodies are refused with the right API's error, and the server serves throughout.

Each round trip makes a file with the format's own library, translates it with
`deepl.Translator.translate_document_from_filepath` (EN -> DE, the shipped model), reads the result back
with the same library and compares its structure with the original's: paragraphs, styles, runs with
their bold/italic in order, tables, slides, cells, subtitle numbering and timings, XLIFF units, notes,
states and inline elements, PO entries, plurals and flags. Only the text may differ, and it must.
"""
from __future__ import annotations

import asyncio
import datetime
import io
import re
import time
import zipfile

import deepl
import httpx
import pytest

from benchmarks.soak import hostile_files
from client.__main__ import main as client_main
from tests.serving import key_file

deepl.http_client.max_network_retries = 0
CAPTIONS = ["A man is riding a bike down the street.", "Two dogs play in the snow.",
            "A woman in a red dress is walking.", "A little girl climbs into a wooden playhouse.",
            "A group of people stand outside a building.", "A boy jumps into the water."]


@pytest.fixture(scope="module")
def srv(shipped_server):
    return shipped_server


@pytest.fixture(scope="module")
def translator(srv):
    return deepl.Translator("any-key", server_url=srv.http)


def roundtrip(translator, tmp_path, name: str, data: bytes) -> bytes:
    src, out = tmp_path / name, tmp_path / ("out-" + name)
    src.write_bytes(data)
    status = translator.translate_document_from_filepath(src, out, source_lang="EN", target_lang="DE")
    assert status.done and status.status == deepl.DocumentStatus.Status.DONE
    assert status.billed_characters and status.billed_characters > 0
    return out.read_bytes()


def changed(before: list[str], after: list[str]) -> None:
    """Same number of texts, every text with letters translated (different), none lost."""
    assert len(before) == len(after)
    for a, b in zip(before, after):
        if re.search(r"[A-Za-z]{3}", a):
            assert b.strip() and b != a, (a, b)


# -- Word ------------------------------------------------------------------------------------
def _docx() -> bytes:
    import docx
    doc = docx.Document()
    doc.add_heading("A dog runs on the beach.", 1)
    p = doc.add_paragraph("A man is ")
    p.add_run("riding").bold = True
    p.add_run(" a bike down the ")
    p.add_run("street").italic = True
    p.add_run(".")
    doc.add_paragraph(CAPTIONS[1], style="List Bullet")
    table = doc.add_table(rows=2, cols=2)
    for k, cell in enumerate(c for row in table.rows for c in row.cells):
        cell.text = CAPTIONS[k + 2]
    doc.sections[0].header.paragraphs[0].text = CAPTIONS[5]
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def _docx_shape(doc) -> list:
    def fmt(p):
        runs = [(bool(r.bold), bool(r.italic)) for r in p.runs if r.text]
        return p.style.name, [f for f in runs if f != (False, False)]
    return [fmt(p) for p in doc.paragraphs] + [len(doc.tables), [len(t.rows) for t in doc.tables]]


def test_docx_round_trip(translator, tmp_path):
    import docx
    data = _docx()
    out = roundtrip(translator, tmp_path, "report.docx", data)
    before, after = docx.Document(io.BytesIO(data)), docx.Document(io.BytesIO(out))
    assert _docx_shape(after) == _docx_shape(before)
    changed([p.text for p in before.paragraphs], [p.text for p in after.paragraphs])
    changed([c.text for t in before.tables for row in t.rows for c in row.cells],
            [c.text for t in after.tables for row in t.rows for c in row.cells])
    changed([before.sections[0].header.paragraphs[0].text], [after.sections[0].header.paragraphs[0].text])
    with zipfile.ZipFile(io.BytesIO(data)) as a, zipfile.ZipFile(io.BytesIO(out)) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        assert a.read("word/styles.xml") == b.read("word/styles.xml")  # a part without text: byte for byte


# -- PowerPoint ------------------------------------------------------------------------------
def _pptx() -> bytes:
    import pptx
    from pptx.util import Inches
    prs = pptx.Presentation()
    for k in range(2):
        slide = prs.slides.add_slide(prs.slide_layouts[1])
        slide.shapes.title.text = CAPTIONS[k]
        frame = slide.placeholders[1].text_frame
        frame.text = CAPTIONS[k + 2]
        p = frame.add_paragraph()
        for text, bold in (("A ", False), ("black", True), (" dog runs.", False)):
            run = p.add_run()
            run.text, run.font.bold = text, bold
        slide.notes_slide.notes_text_frame.text = CAPTIONS[k + 4]
    table = prs.slides[1].shapes.add_table(1, 2, Inches(1), Inches(5), Inches(6), Inches(1)).table
    table.cell(0, 0).text, table.cell(0, 1).text = CAPTIONS[0], "42"
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def _pptx_texts(prs) -> tuple[list, list]:
    shape, texts = [], []
    for slide in prs.slides:
        for sh in slide.shapes:
            shape.append((sh.shape_type, sh.name))
            if sh.has_text_frame:
                for p in sh.text_frame.paragraphs:
                    shape.append([bool(r.font.bold) for r in p.runs if r.text and r.font.bold])
                    texts.append(p.text)
            if sh.has_table:
                cells = [c for row in sh.table.rows for c in row.cells]
                shape.append(len(cells))
                texts += [c.text for c in cells]
        texts.append(slide.notes_slide.notes_text_frame.text)
    return shape, texts


def test_pptx_round_trip(translator, tmp_path):
    import pptx
    data = _pptx()
    out = roundtrip(translator, tmp_path, "deck.pptx", data)
    (shape_a, texts_a), (shape_b, texts_b) = (_pptx_texts(pptx.Presentation(io.BytesIO(d))) for d in (data, out))
    assert shape_b == shape_a
    changed(texts_a, texts_b)
    assert "42" in texts_b


# -- Excel -----------------------------------------------------------------------------------
def test_xlsx_round_trip(translator, tmp_path):
    import openpyxl
    from openpyxl.cell.rich_text import CellRichText, TextBlock
    from openpyxl.cell.text import InlineFont
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = "Captions"
    for k, caption in enumerate(CAPTIONS[:4], start=1):
        ws.cell(k, 1, caption)
        ws.cell(k, 2, k * 1.5)
    ws["C1"] = "=SUM(B1:B4)"
    ws["A6"] = CellRichText(["A man in a ", TextBlock(InlineFont(b=True), "blue"), " shirt."])
    wb.create_sheet("Second")["A1"] = CAPTIONS[5]
    buf = io.BytesIO()
    wb.save(buf)
    out = roundtrip(translator, tmp_path, "sheet.xlsx", buf.getvalue())
    a, b = (openpyxl.load_workbook(io.BytesIO(d), rich_text=True) for d in (buf.getvalue(), out))
    assert a.sheetnames == b.sheetnames
    for sa, sb in zip(a.worksheets, b.worksheets):
        assert sa.dimensions == sb.dimensions
        for ra, rb in zip(sa.iter_rows(), sb.iter_rows()):
            for ca, cb in zip(ra, rb):
                assert type(ca.value) is type(cb.value) and ca.data_type == cb.data_type
                if not isinstance(ca.value, (str, CellRichText)) or str(ca.value).startswith("="):
                    assert ca.value == cb.value
                else:
                    changed([str(ca.value)], [str(cb.value)])
    blocks = [type(x).__name__ for x in b["Captions"]["A6"].value]
    assert blocks.count("TextBlock") == 1 and [x.font.b for x in b["Captions"]["A6"].value
                                               if isinstance(x, TextBlock)] == [True]


# -- OpenDocument ----------------------------------------------------------------------------
def test_odt_round_trip(translator, tmp_path):
    from odf import teletype
    from odf.opendocument import OpenDocumentText, load
    from odf.style import Style, TextProperties
    from odf.text import H, LineBreak, P, Span
    doc = OpenDocumentText()
    bold = Style(name="Bold", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    doc.automaticstyles.addElement(bold)
    doc.text.addElement(H(outlinelevel=1, text=CAPTIONS[0]))
    p = P(text="A woman is ")
    p.addElement(Span(stylename=bold, text="walking"))
    p.addText(" her dog.")
    p.addElement(LineBreak())
    p.addText(CAPTIONS[1])
    doc.text.addElement(p)
    doc.text.addElement(P(text=CAPTIONS[3]))
    buf = io.BytesIO()
    doc.save(buf)
    out = roundtrip(translator, tmp_path, "letter.odt", buf.getvalue())

    def shape(d):
        return [(e.qname, [c.qname for c in e.childNodes if c.nodeType == c.ELEMENT_NODE],
                 [str(c.getAttribute("stylename")) for c in e.childNodes if getattr(c, "qname", ("", ""))[1] == "span"])
                for e in d.text.childNodes]
    a, b = load(io.BytesIO(buf.getvalue())), load(io.BytesIO(out))
    assert shape(b) == shape(a)
    changed([teletype.extractText(e) for e in a.text.childNodes], [teletype.extractText(e) for e in b.text.childNodes])
    assert b"Bold" in zipfile.ZipFile(io.BytesIO(out)).read("content.xml")  # the span's style is kept


# -- subtitles -------------------------------------------------------------------------------
def test_srt_round_trip(translator, tmp_path):
    import srt
    subs = [srt.Subtitle(k + 1, datetime.timedelta(seconds=2 * k, milliseconds=250),
                         datetime.timedelta(seconds=2 * k + 1, milliseconds=900), text)
            for k, text in enumerate(["A man is riding a bike\ndown the street.", "<i>Two dogs</i> play in the snow.",
                                      "{\\an8}A boy jumps into the water."])]
    subs[1].index = 7  # numbering is kept as written, not renumbered
    data = srt.compose(subs, reindex=False).encode()
    out = roundtrip(translator, tmp_path, "film.srt", data)
    back = list(srt.parse(out.decode()))
    assert [(s.index, s.start, s.end, s.content.count("\n")) for s in back] == \
        [(s.index, s.start, s.end, s.content.count("\n")) for s in subs]
    assert back[1].content.count("<i>") == back[1].content.count("</i>") == 1
    assert re.search(r"<i>[^<]+</i>", back[1].content) and back[2].content.startswith("{\\an8}")
    changed([s.content for s in subs], [s.content for s in back])


# -- XLIFF -----------------------------------------------------------------------------------
XLIFF12 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file original="app.json" source-language="en" datatype="plaintext">
    <body>
      <group id="captions">
        <trans-unit id="one"><source>A man is <g id="1">riding</g> a bike.<x id="2"/></source>
          <target state="needs-translation"/><note>shown on the first page</note></trans-unit>
        <trans-unit id="two" translate="no"><source>Brand Name</source></trans-unit>
      </group>
      <trans-unit id="three" approved="no"><source>Two dogs play in the snow.</source>
        <note from="developer">keep it short</note></trans-unit>
    </body>
  </file>
</xliff>
"""
XLIFF20 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
  <file id="f1">
    <unit id="u1"><notes><note>a caption</note></notes>
      <segment state="initial"><source>A woman is <pc id="1">walking</pc> her dog.<ph id="2"/></source></segment>
      <segment><source>A boy jumps into the water.</source></segment>
    </unit>
  </file>
</xliff>
"""


@pytest.mark.parametrize("text, version", [(XLIFF12, "1.2"), (XLIFF20, "2.0")])
def test_xliff_round_trip(translator, tmp_path, text, version):
    from translate.storage import xliff, xliff2
    kind = xliff.xlifffile if version == "1.2" else xliff2.Xliff2File
    out = roundtrip(translator, tmp_path, "app.xlf", text.encode())
    a, b = kind.parsestring(text.encode()), kind.parsestring(out)
    assert [(u.getid(), u.getnotes(), u.istranslatable()) for u in a.units] == \
        [(u.getid(), u.getnotes(), u.istranslatable()) for u in b.units]
    for ua, ub in zip(a.units, b.units):
        ta = ua.xmlelement.find("{*}target")
        tb = ub.xmlelement.find("{*}target")
        if not ua.istranslatable():
            assert tb is None
            continue
        assert tb is not None and tb.text is not None or len(tb)
        assert dict(tb.attrib) == (dict(ta.attrib) if ta is not None else {})  # state, approved kept
        inline = [(e.tag, dict(e.attrib)) for e in ua.xmlelement.find("{*}source").iter()][1:]
        assert [(e.tag, dict(e.attrib)) for e in tb.iter()][1:] == inline
        changed([ua.source], [ub.target])
    def outside_targets(store):  # every element but the targets and what they hold, with its attributes
        return [(e.tag, {k: v for k, v in e.attrib.items() if k not in ("target-language", "trgLang")})
                for e in store.document.getroot().iter()
                if not any(x.tag.endswith("}target") for x in (e, *e.iterancestors()))]
    assert outside_targets(b) == outside_targets(a)


# -- gettext ---------------------------------------------------------------------------------
PO = r'''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"
"Language: en\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

#. a caption on the home page
#: app/home.py:12
#, python-format
msgid "A man is riding %(count)s bikes."
msgstr ""

#: app/home.py:20
msgctxt "photo"
msgid "A dog runs."
msgid_plural "%d dogs run on the beach."
msgstr[0] ""
msgstr[1] ""

#, fuzzy
msgid "Two dogs play in the snow.\n"
msgstr "old"

#~ msgid "An obsolete line."
#~ msgstr "Eine alte Zeile."
'''


def test_po_round_trip(translator, tmp_path):
    import polib
    out = roundtrip(translator, tmp_path, "messages.po", PO.encode())
    a, b = polib.pofile(PO), polib.pofile(out.decode())
    key = [(e.msgid, e.msgid_plural, e.msgctxt, e.flags, e.occurrences, e.comment, sorted(e.msgstr_plural), e.obsolete)
           for e in a]
    assert key == [(e.msgid, e.msgid_plural, e.msgctxt, e.flags, e.occurrences, e.comment, sorted(e.msgstr_plural),
                    e.obsolete) for e in b]
    assert b.metadata["Language"] == "de" and b.metadata["Plural-Forms"] == a.metadata["Plural-Forms"]
    live = [e for e in b if not e.obsolete]
    assert "%(count)s" in live[0].msgstr and live[2].msgstr.endswith("\n")
    assert "%d" in live[1].msgstr_plural[1] and live[1].msgstr_plural[0]
    changed([e.msgid for e in a if not e.obsolete], [e.msgstr or e.msgstr_plural[0] for e in live])
    assert b.obsolete_entries()[0].msgstr == "Eine alte Zeile."


# -- HTML and text ---------------------------------------------------------------------------
def test_html_and_text_round_trip(translator, tmp_path):
    page = ('<!DOCTYPE html>\n<html lang="en"><head><title>A dog runs.</title><style>p{color:red}</style></head>\n'
            '<body><h1 class="t">Two dogs play in the snow.</h1><p>A man is <b>riding</b> a bike.</p>'
            '<pre>keep this</pre><p translate="no">A boy jumps.</p></body></html>\n')
    out = roundtrip(translator, tmp_path, "page.html", page.encode()).decode()
    tags = re.compile(r"<[^>]*>")
    assert tags.findall(out) == tags.findall(page)
    assert "<pre>keep this</pre>" in out and "A boy jumps." in out and "riding" not in out
    text = "\ufeff" + "\n".join(CAPTIONS[:3]) + "\n\n  " + CAPTIONS[3] + "\n"
    out = roundtrip(translator, tmp_path, "notes.txt", text.encode("utf-8"))
    assert out.startswith(b"\xef\xbb\xbf") and out.decode("utf-8-sig").count("\n") == text.count("\n")
    changed(text[1:].splitlines(), out.decode("utf-8-sig").splitlines())


# -- the other APIs and the life of a job ----------------------------------------------------
def test_libretranslate_translate_file_and_download_once(srv):
    files = {"file": ("captions.txt", "\n".join(CAPTIONS).encode(), "text/plain")}
    r = httpx.post(f"{srv.http}/translate_file", data={"source": "en", "target": "de"}, files=files, timeout=120)
    assert r.status_code == 200, r.text
    url = r.json()["translatedFileUrl"]
    assert url.startswith(srv.http + "/download_file/") and url.endswith("captions.txt")
    got = httpx.get(url, timeout=30)
    assert got.status_code == 200 and got.text.count("\n") == len(CAPTIONS) - 1 and "Hund" in got.text
    again = httpx.get(url, timeout=30)
    assert again.status_code == 404 and "error" in again.json()


def test_native_files_api(srv):
    r = httpx.post(f"{srv.http}/v1/files", data={"target_language": "fr"}, timeout=60,
                   files={"file": ("a.srt", b"1\n00:00:01,000 --> 00:00:02,000\nTwo dogs play in the snow.\n\n")})
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["segmentsTotal"] == 1 and job["status"] in ("queued", "translating", "done")
    for _ in range(300):
        job = httpx.get(f"{srv.http}/v1/files/{job['id']}", timeout=30).json()
        if job["status"] == "done":
            break
        time.sleep(0.1)
    assert job["segmentsDone"] == 1 and job["targetLanguage"] == "fr"
    content = httpx.get(f"{srv.http}/v1/files/{job['id']}/content", timeout=30)
    assert content.status_code == 200 and "chiens" in content.text and "00:00:01,000 --> 00:00:02,000" in content.text
    assert httpx.get(f"{srv.http}/v1/files/{job['id']}", timeout=30).status_code == 404


def test_deepl_status_result_and_keys(srv, translator):
    handle = translator.translate_document_upload(CAPTIONS[0], source_lang="EN", target_lang="DE",
                                                  filename="one.txt")
    assert re.fullmatch(r"[0-9A-F]{32}", handle.document_id) and re.fullmatch(r"[0-9A-F]{64}", handle.document_key)
    wrong = deepl.DocumentHandle(handle.document_id, "0" * 64)
    with pytest.raises(deepl.DeepLException, match="Not found"):
        translator.translate_document_get_status(wrong)
    status = translator.translate_document_wait_until_done(handle)
    assert status.done and status.billed_characters == len(CAPTIONS[0])
    out = io.BytesIO()
    translator.translate_document_download(handle, out)
    assert "Fahrrad" in out.getvalue().decode()
    with pytest.raises(deepl.DeepLException, match="Not found"):  # downloaded once: deleted
        translator.translate_document_get_status(handle)


def test_client_translate_file_document(srv, tmp_path):
    import docx
    src, out = tmp_path / "in.docx", tmp_path / "in.de.docx"
    src.write_bytes(_docx())
    assert client_main(["--target", srv.target, "translate-file", str(src), "-o", str(out),
                        "--target-language", "de", "--no-progress"]) == 0
    a, b = docx.Document(str(src)), docx.Document(str(out))
    assert _docx_shape(b) == _docx_shape(a)
    changed([p.text for p in a.paragraphs], [p.text for p in b.paragraphs])
    assert client_main(["--target", srv.target, "translate-file", str(src), "-o", str(out)]) == 2  # no overwrite


# -- bad and hostile files and bodies --------------------------------------------------------
def _cases() -> list[tuple]:
    """(case, file name, content, HTTP status, message pattern) for DeepL's /v2/document: the soak's set
    (benchmarks/soak/hostile_files.py), built around this file's own DOCX and PPTX."""
    return hostile_files.cases(_docx(), _pptx())


def _body_cases() -> list[tuple]:
    """(case, request keyword arguments, HTTP status, message pattern): form bodies, not files."""
    good = {"file": ("a.txt", b"A man rides a bike.")}
    return [
        ("JSON instead of a form", dict(json={"target_lang": "DE", "file": "A man."}), 400, "multipart"),
        ("form without a file", dict(data={"target_lang": "DE"}, files={"other": ("x.txt", b"x")}), 400,
         "Parameter 'file'"),
        ("file sent as a text field", dict(content=b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\n'
                                           b"A man.\r\n--b--\r\n", headers={"content-type": "multipart/form-data; "
                                                                            "boundary=b"}), 400, "Parameter 'file'"),
        ("two files", dict(data={"target_lang": "DE"}, files=[("file", ("a.txt", b"a")), ("file", ("b.txt", b"b"))]),
         400, "multipart"),
        ("truncated multipart", dict(content=b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.txt"'
                                     b"\r\n\r\nA man", headers={"content-type": "multipart/form-data; boundary=b"}),
         400, "multipart|Parameter"),
        ("no boundary", dict(content=b"xx", headers={"content-type": "multipart/form-data"}), 400, "multipart"),
        ("missing target_lang", dict(data={}, files=good), 400, "target_lang"),
        ("unserved target_lang", dict(data={"target_lang": "JA"}, files=good), 400, "target_lang"),
        ("unserved source_lang", dict(data={"target_lang": "DE", "source_lang": "FR"}, files=good), 400,
         "source_lang"),
        ("target_lang twice", dict(data={"target_lang": ["DE", "FR"]}, files=good), 400, "once"),
        ("formality the model lacks", dict(data={"target_lang": "DE", "formality": "more"}, files=good), 400,
         "formality"),
        ("another output format", dict(data={"target_lang": "DE", "output_format": "pdf"}, files=good), 400,
         "output_format"),
    ]


def _alive(srv) -> None:
    assert httpx.get(f"{srv.http}/healthz", timeout=10).status_code == 200


def test_hostile_files_get_deepl_errors(srv):
    cases = _cases()
    assert len(cases) + len(_body_cases()) >= 30
    for case, name, data, status, pattern in cases:
        r = httpx.post(f"{srv.http}/v2/document", data={"target_lang": "DE"}, files={"file": (name, data)},
                       timeout=60)
        assert r.status_code == status, (case, r.status_code, r.text[:300])
        assert re.search(pattern, r.json()["message"], re.I), (case, r.json())
        assert "root:" not in r.text
        _alive(srv)


def test_bad_form_bodies_get_deepl_errors(srv):
    for case, kwargs, status, pattern in _body_cases():
        r = httpx.post(f"{srv.http}/v2/document", timeout=60, **kwargs)
        assert r.status_code == status, (case, r.status_code, r.text[:300])
        assert re.search(pattern, r.json()["message"], re.I), (case, r.json())
        _alive(srv)
    for params in ({"document_key": "0" * 64}, {}):  # an unknown id, a missing key
        r = httpx.post(f"{srv.http}/v2/document/{'A' * 32}", json=params, timeout=30)
        assert r.status_code in (400, 404) and "message" in r.json()


def test_hostile_files_get_libretranslate_and_native_errors(srv):
    for case, name, data, status, pattern in _cases()[::3]:
        r = httpx.post(f"{srv.http}/translate_file", data={"source": "en", "target": "de"},
                       files={"file": (name, data)}, timeout=60)
        assert r.status_code == status and re.search(pattern, r.json()["error"], re.I), (case, r.text[:300])
        r = httpx.post(f"{srv.http}/v1/files", data={"target_language": "de"}, files={"file": (name, data)},
                       timeout=60)
        error = r.json()["error"]
        assert r.status_code == status and error["code"] == status and re.search(pattern, error["message"], re.I), \
            (case, r.text[:300])
        _alive(srv)
    r = httpx.post(f"{srv.http}/translate_file", data={"target": "de"}, files={"file": ("a.txt", b"A man.")})
    assert r.status_code == 400 and "source" in r.json()["error"]
    assert httpx.get(f"{srv.http}/download_file/{'0' * 32}.a.txt").status_code == 404
    # The server still translates after all of it.
    r = httpx.post(f"{srv.http}/v2/translate", json={"text": [CAPTIONS[1]], "target_lang": "DE"}, timeout=60)
    assert r.status_code == 200 and "Hunde" in r.json()["translations"][0]["text"]


# -- the job store's bounds, without a server -------------------------------------------------
def test_jobs_bounds_expiry_and_failures(monkeypatch):
    import grpc

    from server.files import jobs as jobs_module
    from server.edge.gateway import Caller, CallFailed
    now = [1000.0]
    gate = None

    async def translate(job, texts):
        await gate.wait()
        if "refuse" in texts[0]:
            raise CallFailed(grpc.StatusCode.INVALID_ARGUMENT, "text 0 is refused")
        return [t.upper() for t in texts]

    async def detect(job, sample):
        return "en"

    async def scenario():
        nonlocal gate
        gate = asyncio.Event()
        monkeypatch.setattr(jobs_module, "MAX_ACTIVE", 2)
        jobs = jobs_module.Jobs(translate, detect, clock=lambda: now[0])
        a = await jobs.submit("a.txt", b"A man rides.", "en", "de", Caller(), "")
        b = await jobs.submit("b.txt", b"refuse this", "en", "de", Caller(), "")
        with pytest.raises(jobs_module.Full):  # two unfinished jobs: the limit
            await jobs.submit("c.txt", b"A dog.", "en", "de", Caller(), "")
        with pytest.raises(jobs_module.FileError, match="file extension"):
            await jobs.submit("c.exe", b"A dog.", "en", "de", Caller(), "")
        assert a.status in ("queued", "translating") and a.seconds_remaining(now[0]) >= 1
        gate.set()
        await asyncio.wait_for(asyncio.gather(a.ended.wait(), b.ended.wait()), 10)
        assert (a.status, a.done, a.total, a.billed) == ("done", 1, 1, len("A man rides."))
        assert (b.status, b.error) == ("error", "text 0 is refused") and jobs.take(b) is None
        assert jobs.take(a) == b"A MAN RIDES." and jobs.get(a.id) is None  # downloaded once
        now[0] += jobs_module.TTL_S + 1
        assert jobs.get(b.id) is None  # expired
        c = await jobs.submit("c.txt", b"A dog.", "en", "de", Caller(), "")  # room again
        await asyncio.wait_for(c.ended.wait(), 10)
        assert c.status == "done"
    asyncio.run(scenario())


def test_keys_own_their_documents(start_server, tmp_path):
    from server.security import keys
    keyed = start_server(api_keys_file=key_file(tmp_path, keys.file_line("alice", "alice-key"),
                                                keys.file_line("bob", "bob-key")))
    upload = dict(data={"target_lang": "DE"}, files={"file": ("a.txt", CAPTIONS[1].encode())}, timeout=60)
    assert httpx.post(f"{keyed.http}/v2/document", **upload).status_code == 403  # no key
    assert httpx.post(f"{keyed.http}/v2/document", headers={"Authorization": "DeepL-Auth-Key nope"},
                      **upload).status_code == 403
    alice, bob = (deepl.Translator(k, server_url=keyed.http) for k in ("alice-key", "bob-key"))
    handle = alice.translate_document_upload(CAPTIONS[1], target_lang="DE", filename="a.txt")
    with pytest.raises(deepl.DeepLException, match="Not found"):  # another key's document
        bob.translate_document_get_status(handle)
    assert alice.translate_document_wait_until_done(handle).done
    native = httpx.post(f"{keyed.http}/v1/files", data={"target_language": "de"}, timeout=60,
                        files={"file": ("a.txt", b"A dog.")}, headers={"Authorization": "Bearer bob-key"})
    assert native.status_code == 200
    ident = native.json()["id"]
    assert httpx.get(f"{keyed.http}/v1/files/{ident}").status_code == 401
    assert httpx.get(f"{keyed.http}/v1/files/{ident}", headers={"Authorization": "Bearer alice-key"}).status_code == 404
    r = httpx.post(f"{keyed.http}/translate_file", data={"source": "en", "target": "de"},
                   files={"file": ("a.txt", b"A dog.")}, timeout=60)
    assert r.status_code == 403 and "error" in r.json()
