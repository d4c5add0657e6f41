"""The translator page (/) and the status page (/status) in a real browser: Debian's chromium through its
chromium-driver (benchmarks/browser.py), against a real server on loopback ports with real models.

What must hold: the page's translation is the API's, token for token (streamed, detected, swapped, from a
link, alternatives, documents); a refused file's message is the server's own; text from the server is
never markup; every control is labelled, reachable and usable from the keyboard; text contrast is at
least 4.5:1 in the light and the dark scheme; the browser logs no error in a normal session; the pages
call only API endpoints, behind the same keys; the status page's plot follows the load.
Screenshots (desktop and phone widths, light and dark) are written to build/screenshots/
(NMT_SCREENSHOT_DIR to put them elsewhere).

Without chromium the browser tests skip, or fail under NMT_REQUIRE_TOOLS=1 (CI installs it).
"""
from __future__ import annotations

import io
import json
import os
import re
import ssl
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import docx
import httpx
import jsonschema
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from benchmarks.browser import APT_HINT, binaries, color_scheme, start_chromium, viewport
from server.edge.http.pages import CSP
from server.security import keys
from tests.serving import REPOSITORY, ServerThread, key_file

WAIT_S = 60  # an upper bound for a page to finish what it was asked: conditions are waited for, never slept
KEY = "nmt_web_page_key"
HOSTILE = "<img src=x onerror=\"document.title='pwned'\"> A dog runs."
SHOTS = Path(os.environ.get("NMT_SCREENSHOT_DIR") or Path(__file__).resolve().parents[2] / "build" / "screenshots")


def _need_browser() -> None:
    if binaries() is None:
        reason = f"chromium and chromedriver are not installed ({APT_HINT})"
        if os.environ.get("NMT_REQUIRE_TOOLS") == "1":
            pytest.fail(reason + " and NMT_REQUIRE_TOOLS=1")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """The shipped en->de model, and the en->fr bundle relabelled de->en (a pair served both ways, so the
    page's swap has somewhere to go) and en->ar (a target written right to left)."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "multi30k-en-de-small").symlink_to(REPOSITORY / "multi30k-en-de-small")
    version = next((REPOSITORY / "multi30k-en-fr-small").iterdir())
    for source, target in (("de", "en"), ("en", "ar")):
        folder = repo / f"relabelled-{source}-{target}" / version.name
        folder.mkdir(parents=True)
        for item in version.iterdir():
            if item.name != "config.json":
                (folder / item.name).symlink_to(item)
        config = json.loads((version / "config.json").read_text())
        config.update(name=f"relabelled-{source}-{target}", source_language=source, target_language=target)
        config.pop("languages", None)
        (folder / "config.json").write_text(json.dumps(config))
    s = ServerThread(model_repository=str(repo), glossary_db=str(repo / "glossaries.sqlite3")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    _need_browser()
    session = start_chromium(downloads)
    yield session
    session.quit()


def api(srv, path: str, body: dict | None = None, key: str | None = None, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if body is None and not kwargs:
        return httpx.get(srv.http + path, headers=headers, timeout=60)
    return httpx.post(srv.http + path, json=body, headers=headers, timeout=60, **kwargs)


def api_translation(srv, text: str, target: str, source: str = "") -> str:
    body = {"texts": [text], "targetLanguage": target, **({"sourceLanguage": source} if source else {})}
    response = api(srv, "/v1/translate", body)
    assert response.status_code == 200, response.text
    return response.json()["translations"][0]["hypotheses"][0]["text"]


def by(session, ident: str):
    return session.find_element(By.ID, ident)


def wait(session, condition, message: str):
    return WebDriverWait(session, WAIT_S, poll_frequency=0.05).until(lambda s: condition(s), message)


def open_page(session, url: str) -> None:
    session.get(url)
    wait(session, lambda s: len(Select(by(s, "target")).options) > 0, "the page never listed the target languages")


def translate(session, text: str, source: str | None = None, target: str | None = None) -> str:
    """Type `text`, choose the languages, press Translate; the streamed translation once it is whole."""
    if source is not None:
        Select(by(session, "source")).select_by_value(source)
    if target is not None:
        Select(by(session, "target")).select_by_value(target)
    box = by(session, "text")
    box.clear()
    box.send_keys(text)
    by(session, "translate").click()
    return finished(session)


def finished(session) -> str:
    wait(session, lambda s: by(s, "output").get_attribute("data-done") or by(s, "text-error").text,
         "the translation never finished")
    assert by(session, "text-error").text == ""
    return by(session, "output").text


# -- the pages as files: no browser ------------------------------------------------------------
def test_pages_are_served_from_the_server_under_a_policy_that_forbids_inline_and_outside_code(srv):
    pages = {path: httpx.get(srv.http + path, timeout=30) for path in
             ("/", "/status", "/web/api.js", "/web/translator.js", "/web/status.js", "/web/style.css",
              "/web/icon.svg", "/favicon.ico")}
    for path, response in pages.items():
        assert response.status_code == 200, path
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "'unsafe-inline'" not in CSP and "'unsafe-eval'" not in CSP
        # nothing from another origin: no absolute address at all in any file the pages load
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", response.text.replace(
            "http://www.w3.org/2000/svg", "")), path
    for path in ("/", "/status"):
        html = pages[path].text
        assert re.findall(r"<script\b[^>]*>", html) and all(
            "src=" in tag for tag in re.findall(r"<script\b[^>]*>", html)), "an inline script"
        assert "<style" not in html and " style=" not in html, "an inline style"
        assert not re.search(r"<[^>]+\son[a-z]+=", html), "an event-handler attribute"
    again = httpx.get(srv.http + "/", headers={"If-None-Match": pages["/"].headers["etag"]}, timeout=30)
    assert again.status_code == 304 and again.content == b""
    head = httpx.head(srv.http + "/web/translator.js", timeout=30)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(pages["/web/translator.js"].content)
    for path in ("/web/../pages.py", "/web/missing.js", "/web/%2e%2e%2fpages.py"):
        missing = httpx.get(srv.http + path, timeout=30)
        assert missing.status_code == 404 and missing.json()["error"]["status"] == "NOT_FOUND", path


def test_web_ui_false_leaves_only_the_api(start_server):
    s = start_server(web_ui=False)
    assert httpx.get(s.http + "/", timeout=30).status_code == 404
    assert httpx.get(s.http + "/web/translator.js", timeout=30).status_code == 404
    assert httpx.get(s.http + "/v1/status", timeout=30).status_code == 200  # an API endpoint, not a page


def test_status_endpoint_counts_the_engines_work(srv):
    before = api(srv, "/v1/status").json()
    text = "A man is riding a bike."
    api_translation(srv, text, "de")
    after = api(srv, "/v1/status").json()
    assert after["health"] == {"live": "SERVING", "ready": "SERVING"}
    assert after["engine"] == "thread" and after["replicas"][0]["up"] is True
    models = {m["name"]: m for m in after["models"]}
    assert set(models) == {"multi30k-en-de-small", "relabelled-de-en", "relabelled-en-ar"}
    de, old = models["multi30k-en-de-small"], {m["name"]: m for m in before["models"]}["multi30k-en-de-small"]
    assert de["pairs"] == ["en-de"] and de["texts"] == old["texts"] + 1
    assert de["outputTokens"] > old["outputTokens"]
    latency = de["latency"]
    assert latency["count"] == de["texts"] and latency["counts"] == sorted(latency["counts"])
    assert latency["counts"][-1] <= latency["count"] and len(latency["bounds"]) == len(latency["counts"])
    assert [(p["role"], p["name"], p["pid"]) for p in after["memory"]] == [("frontend", "0", os.getpid())]
    assert after["memoryTotalBytes"] == after["memory"][0]["rssBytes"] > 10 << 20  # this test process, at least
    described = api(srv, "/openapi.json").json()
    jsonschema.validate(after, described["components"]["schemas"]["Status"])  # what /openapi.json says it is
    assert "/v1/status" in described["paths"]


# -- the translator page ---------------------------------------------------------------------
def test_a_typed_sentence_streams_in_and_is_the_apis_translation(srv, browser):
    text = "A man is riding a bike. Two dogs play in the snow. A woman sings on a stage."
    streams = srv.metric("nmt_http_requests_total", missing_ok=True, api="native", operation="TranslateStream",
                         status="200")
    open_page(browser, srv.http + "/")
    shown = translate(browser, text, source="en", target="de")
    assert shown == api_translation(srv, text, "de", "en")
    assert srv.metric("nmt_http_requests_total", api="native", operation="TranslateStream", status="200") \
        == streams + 1  # through the stream endpoint: the words appear as they decode
    output = by(browser, "output")
    assert int(output.get_attribute("data-deltas")) >= 1
    wait(browser, lambda s: by(s, "output").get_attribute("data-first-words-ms"), "no first-words time")
    assert output.get_attribute("lang") == "de" and output.get_attribute("dir") == "ltr"
    assert "multi30k-en-de-small" in by(browser, "meta").text
    assert by(browser, "count").text == f"{len(text)} / {srv.cfg.max_text_chars}"


def test_detection_names_the_language_and_its_confidence(srv, browser):
    open_page(browser, srv.http + "/")
    text = "Two young men are standing in front of a red building."
    assert translate(browser, text, source="", target="de") == api_translation(srv, text, "de")
    assert re.search(r"detected English \(\d+%\)", by(browser, "meta").text), by(browser, "meta").text


def test_swap_turns_the_pair_around_and_the_address_reproduces_the_translation(srv, browser):
    open_page(browser, srv.http + "/")
    german = translate(browser, "A man is riding a bike.", source="en", target="de")
    swap = by(browser, "swap")
    assert swap.is_enabled()  # de->en is served
    swap.click()
    back = finished(browser)
    assert Select(by(browser, "source")).first_selected_option.get_attribute("value") == "de"
    assert Select(by(browser, "target")).first_selected_option.get_attribute("value") == "en"
    assert by(browser, "text").get_attribute("value") == german
    assert back == api_translation(srv, german, "en", "de")
    address = browser.current_url
    assert parse_qs(urlparse(address).query) == {"source": ["de"], "target": ["en"], "q": [german]}
    browser.get("about:blank")
    browser.get(address)  # a fresh load of the link: the same translation, with nothing typed
    assert finished(browser) == back
    # without a model for the way back there is nothing to swap to
    Select(by(browser, "source")).select_by_value("")
    Select(by(browser, "target")).select_by_value("de")
    browser.execute_script("document.getElementById('output').textContent = ''")
    open_page(browser, srv.http + "/?target=de")
    assert not by(browser, "swap").is_enabled()


def test_alternatives_for_a_sentence_are_the_apis(srv, browser):
    open_page(browser, srv.http + "/?source=en&target=de")
    text = "A little girl climbs into a wooden playhouse."
    box = by(browser, "text")
    box.send_keys(text)
    by(browser, "more").click()
    wait(browser, lambda s: s.find_elements(By.CSS_SELECTOR, "#alternatives li"), "no alternatives shown")
    shown = [li.text for li in browser.find_elements(By.CSS_SELECTOR, "#alternatives li")]
    body = {"texts": [text], "sourceLanguage": "en", "targetLanguage": "de", "options": {"alternatives": 5}}
    hypotheses = api(srv, "/v1/translate", body).json()["translations"][0]["hypotheses"]
    assert shown == [h["text"] for h in hypotheses[1:]] and len(shown) >= 1
    browser.find_elements(By.CSS_SELECTOR, "#alternatives button")[0].click()  # use it
    assert by(browser, "output").text == shown[0]


def test_copy_puts_the_translation_on_the_clipboard(srv, browser):
    browser.execute_cdp_cmd("Browser.grantPermissions", {"origin": srv.http, "permissions": [
        "clipboardReadWrite", "clipboardSanitizedWrite"]})
    open_page(browser, srv.http + "/?source=en&target=de")
    shown = translate(browser, "Two dogs play in the snow.")
    by(browser, "copy").click()
    wait(browser, lambda s: by(s, "copy").text == "Copied", "the copy was not confirmed")
    pasted = browser.execute_async_script("navigator.clipboard.readText().then(arguments[0])")
    assert pasted == shown


def test_a_glossary_of_the_callers_is_offered_and_applied(srv, browser):
    made = httpx.post(srv.http + "/v3/glossaries", timeout=30, json={"name": "bikes", "dictionaries": [
        {"source_lang": "en", "target_lang": "de", "entries": "bike\tVelo", "entries_format": "tsv"}]})
    assert made.status_code == 201, made.text
    ident = made.json()["glossary_id"]
    open_page(browser, srv.http + "/?target=de")  # the source left to detection
    choice = Select(by(browser, "glossary"))
    assert [o.text for o in choice.options] == ["None", "bikes (en \u2192 de, 1 entries)"]
    choice.select_by_value(f"{ident}:en:de")  # the glossary's pair becomes the page's
    assert Select(by(browser, "source")).first_selected_option.get_attribute("value") == "en"
    text = "A man is riding a bike."
    shown = translate(browser, text)
    body = {"texts": [text], "sourceLanguage": "en", "targetLanguage": "de", "glossaryId": ident}
    assert shown == api(srv, "/v1/translate", body).json()["translations"][0]["hypotheses"][0]["text"]
    assert "Velo" in shown and shown != api_translation(srv, text, "de", "en")
    Select(by(browser, "target")).select_by_value("de")
    Select(by(browser, "source")).select_by_value("")  # another pair: the glossary no longer applies
    assert choice.first_selected_option.get_attribute("value") == ""


def _docx(paragraphs: list[str]) -> bytes:
    document = docx.Document()
    for p in paragraphs:
        document.add_paragraph(p)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def _paragraphs(data: bytes) -> list[str]:
    return [p.text for p in docx.Document(io.BytesIO(data)).paragraphs]


def _api_file(srv, name: str, data: bytes, target: str) -> bytes:
    job = httpx.post(srv.http + "/v1/files", files={"file": (name, data)}, data={"target_language": target,
                                                                                 "source_language": "en"},
                     timeout=60).json()
    for _ in range(WAIT_S * 10):
        job = httpx.get(f"{srv.http}/v1/files/{job['id']}", timeout=30).json()
        if job["status"] in ("done", "error"):
            break
        time.sleep(0.1)
    assert job["status"] == "done", job
    return httpx.get(f"{srv.http}/v1/files/{job['id']}/content", timeout=30).content


def _upload(browser, path: Path) -> None:
    by(browser, "file").send_keys(str(path))
    by(browser, "file-translate").click()


def test_a_docx_uploaded_in_the_page_comes_back_translated(srv, browser, downloads, tmp_path):
    paragraphs = ["A man is riding a bike.", "Two dogs play in the snow."]
    data = _docx(paragraphs)
    path = tmp_path / "report.docx"
    path.write_bytes(data)
    open_page(browser, srv.http + "/?source=en&target=de")
    _upload(browser, path)
    link = wait(browser, lambda s: by(s, "download").is_displayed() and by(s, "download"), "no download link")
    assert link.text == "Download report.docx" and link.get_attribute("download") == "report.docx"
    assert "translated (2 segments" in by(browser, "file-state").text
    progress = by(browser, "file-progress")  # the bar followed the job to its end
    assert progress.is_displayed() and progress.get_attribute("value") == progress.get_attribute("max") == "2"
    for old in downloads.glob("report*.docx"):
        old.unlink()
    link.click()
    saved = downloads / "report.docx"
    wait(browser, lambda s: saved.exists() and saved.stat().st_size > 0, "the browser never saved the file")
    assert _paragraphs(saved.read_bytes()) == _paragraphs(_api_file(srv, "report.docx", data, "de"))
    assert _paragraphs(saved.read_bytes()) != paragraphs


def test_a_refused_file_shows_the_servers_own_words(srv, browser, tmp_path):
    path = tmp_path / "broken.docx"
    path.write_bytes(b"this is not a Word file")
    refused = httpx.post(srv.http + "/v1/files", files={"file": ("broken.docx", path.read_bytes())},
                         data={"target_language": "de"}, timeout=60)
    assert refused.status_code == 400
    open_page(browser, srv.http + "/?target=de")
    _upload(browser, path)
    wait(browser, lambda s: by(s, "file-error").text, "no error shown for a refused file")
    assert by(browser, "file-error").text == refused.json()["error"]["message"]
    assert not by(browser, "download").is_displayed()


def test_text_from_the_server_is_shown_as_text_never_as_markup(srv, browser, tmp_path):
    open_page(browser, srv.http + "/?source=en&target=de")
    title = browser.title
    translate(browser, HOSTILE)
    assert browser.execute_script("return document.getElementById('output').children.length") == 0
    # a file whose name is markup: shown in the status line and the link as the characters it is made of
    path = tmp_path / "<img src=x onerror=document.title=1>.txt"
    path.write_text("A dog runs.\n")
    _upload(browser, path)
    link = wait(browser, lambda s: by(s, "download").is_displayed() and by(s, "download"), "no download link")
    assert link.text == f"Download {path.name}"
    assert browser.execute_script("return document.querySelectorAll('main img, #download *, #file-state *').length") \
        == 0
    assert browser.title == title


def test_keyboard_alone_reaches_every_control_and_translates(srv, browser):
    open_page(browser, srv.http + "/?source=en&target=de")
    browser.execute_script("document.activeElement.blur()")
    keyboard = lambda *keys: ActionChains(browser).send_keys(*keys).perform()  # noqa: E731 (to what has focus)
    order = []
    keyboard(Keys.TAB)
    for _ in range(25):
        ident = browser.execute_script("const e = document.activeElement; return e.id || e.textContent.trim()")
        order.append(ident)
        if ident == "file-translate":
            break
        keyboard(Keys.TAB)
    expected = ["source", "target", "glossary", "text", "translate", "output", "copy", "more", "file",
                "file-translate"]
    assert [i for i in order if i in expected] == expected, order
    # back to the text box from the keyboard, type, and Ctrl+Enter translates
    for _ in range(len(order)):
        if browser.execute_script("return document.activeElement.id") == "text":
            break
        ActionChains(browser).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    assert browser.execute_script("return document.activeElement.id") == "text"
    keyboard("Two dogs play in the snow.")
    ActionChains(browser).key_down(Keys.CONTROL).send_keys(Keys.ENTER).key_up(Keys.CONTROL).perform()
    assert finished(browser) == api_translation(srv, "Two dogs play in the snow.", "de", "en")


LABELS_JS = """
const unnamed = [];
for (const e of document.querySelectorAll('input, select, textarea, button, progress, canvas, [role=region], a')) {
  const labelled = (e.getAttribute('aria-labelledby') || '').split(' ').filter(Boolean)
    .map((id) => (document.getElementById(id) || {}).textContent || '').join(' ');
  const name = [e.getAttribute('aria-label'), labelled, e.labels ? [...e.labels].map((l) => l.textContent).join(' ') : '',
                ['BUTTON', 'A'].includes(e.tagName) ? e.textContent : ''].join(' ').trim();
  if (!name && e.getClientRects().length) unnamed.push(e.outerHTML.slice(0, 80));
}
return unnamed;
"""

# Contrast of every piece of visible text against the background it is drawn on (WCAG 2's formula).
CONTRAST_JS = """
const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
const lum = (c) => { const [r, g, b] = rgb(c).slice(0, 3).map((v) => { v /= 255;
  return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
const background = (e) => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
  if (rgb(c).length === 3 || rgb(c)[3] > 0) return c; } return 'rgb(255, 255, 255)'; };
const low = [];
for (const e of document.querySelectorAll('body *')) {
  if (!e.getClientRects().length || e.closest(':disabled') || ['OPTION', 'SCRIPT', 'CANVAS'].includes(e.tagName)) continue;
  const own = [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  if (!own) continue;
  const a = lum(getComputedStyle(e).color), b = lum(background(e));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) low.push(`${e.tagName}#${e.id} ${ratio.toFixed(2)}: ${e.textContent.trim().slice(0, 40)}`);
}
return low;
"""


def test_every_control_is_labelled_contrast_holds_in_both_schemes_and_the_console_stays_clean(srv, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.get_log("browser")  # what earlier tests left (a refused file is logged as a failed request)
    try:
        for scheme in ("light", "dark"):
            color_scheme(browser, scheme)
            for width, height, mobile, kind in ((1280, 900, False, "desktop"), (390, 844, True, "phone")):
                viewport(browser, width, height, mobile)
                open_page(browser, srv.http + "/?source=en&target=de&q=" + "A man is riding a bike.")
                finished(browser)
                assert browser.execute_script(LABELS_JS) == []
                assert browser.execute_script(CONTRAST_JS) == [], scheme
                # a phone widens its layout viewport to fit content that is too wide: innerWidth says so
                assert browser.execute_script("return [innerWidth, document.documentElement.scrollWidth]") \
                    == [width, width], f"the page is wider than a {width}px screen"
                browser.save_screenshot(str(SHOTS / f"translator-{kind}-{scheme}.png"))
                browser.get(srv.http + "/status?every=0.25")
                wait(browser, lambda s: int(by(s, "plot").get_attribute("data-points") or 0) >= 1, "no plot")
                assert browser.execute_script(LABELS_JS) == []
                assert browser.execute_script(CONTRAST_JS) == [], scheme
                browser.save_screenshot(str(SHOTS / f"status-{kind}-{scheme}.png"))
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        color_scheme(browser, "light")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []


def test_right_to_left_targets_are_shown_right_to_left(srv, browser):
    open_page(browser, srv.http + "/?source=en&target=ar")
    translate(browser, "A man is riding a bike.")
    output = by(browser, "output")
    assert (output.get_attribute("dir"), output.get_attribute("lang")) == ("rtl", "ar")
    assert browser.execute_script("return getComputedStyle(arguments[0]).direction", output) == "rtl"
    translate(browser, "A man is riding a bike.", target="de")
    assert (output.get_attribute("dir"), output.get_attribute("lang")) == ("ltr", "de")
    direction = browser.execute_script("return import('/web/api.js').then((m) => [m.direction('he-IL'), "
                                       "m.direction('fa'), m.direction('ur_PK'), m.direction('en')])")
    assert direction == ["rtl", "rtl", "rtl", "ltr"]


# -- the status page -------------------------------------------------------------------------
def test_the_status_plot_follows_the_load(srv, browser):
    browser.get(srv.http + "/status?every=0.25")
    wait(browser, lambda s: int(by(s, "plot").get_attribute("data-points") or 0) >= 2, "the plot never updated")
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#models tr")]
    assert any(r.startswith("multi30k-en-de-small") for r in rows) and any("relabelled-de-en" in r for r in rows)
    assert by(browser, "health").text == "serving"
    assert [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#replicas td.up")] == ["up"]
    memory = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#memory tr")]
    assert len(memory) == 1 and memory[0].startswith(f"frontend 0 {os.getpid()} ") and memory[0].endswith(" MB")
    points = int(by(browser, "plot").get_attribute("data-points"))
    for _ in range(3):
        api_translation(srv, "A man is riding a bike. Two dogs play in the snow.", "de", "en")
    wait(browser, lambda s: float(by(s, "plot").get_attribute("data-peak-rate") or 0) > 0,
         "the plot never showed the translations' tokens")
    assert int(by(browser, "plot").get_attribute("data-points")) > points
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "status-after-load.png"))


# -- TLS and API keys ------------------------------------------------------------------------
def test_the_page_works_over_tls(tmp_path):
    """With --tls-cert-file the HTTP port is HTTPS too: the page loads, streams and reads its status there."""
    _need_browser()
    from cryptography.hazmat.primitives.asymmetric import ec

    from tests.system.test_security import _certificate, _name, _write
    key = ec.generate_private_key(ec.SECP256R1())
    cert, key_path = _write(tmp_path, "server", key, _certificate("web test", key, _name("web test"), key,
                                                                   server=True))
    s = ServerThread(tls_cert_file=cert, tls_key_file=key_path).start()
    session = start_chromium(insecure_certs=True)  # the test's own certificate: no system CA signed it
    try:
        base = s.http.replace("http://", "https://")
        open_page(session, base + "/?source=en&target=de")
        text = "A man is riding a bike."
        shown = translate(session, text)
        expected = httpx.post(base + "/v1/translate", verify=ssl.create_default_context(cafile=cert), timeout=60, json={
            "texts": [text], "sourceLanguage": "en", "targetLanguage": "de"}).json()
        assert shown == expected["translations"][0]["hypotheses"][0]["text"]
        session.get(base + "/status?every=0.25")
        wait(session, lambda d: int(by(d, "plot").get_attribute("data-points") or 0) >= 1, "no status over TLS")
    finally:
        session.quit()
        s.stop()


# -- API keys ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    s = ServerThread(api_keys_file=key_file(tmp_path_factory.mktemp("keys"), keys.file_line("web", KEY))).start()
    yield s
    s.stop()


def test_with_keys_the_page_asks_for_one_and_its_calls_are_checked_like_any_clients(keyed, browser):
    for path in ("/v1/status", "/v1/models"):  # what the pages call, refused without a key as any API call
        assert api(keyed, path).status_code == 401
        assert api(keyed, path, key="wrong").status_code == 401
        assert api(keyed, path, key=KEY).status_code == 200
    assert httpx.get(keyed.http + "/", timeout=30).status_code == 200  # the page's files carry nothing secret
    browser.get(keyed.http + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(keyed.http + "/?source=en&target=de")
    wait(browser, lambda s: by(s, "key-form").is_displayed(), "the page never asked for a key")
    assert "API key" in by(browser, "key-note").text
    assert Select(by(browser, "target")).options == []  # nothing listed before a key
    by(browser, "key").send_keys("not-the-key", Keys.ENTER)
    wait(browser, lambda s: by(s, "key-form").is_displayed() and "invalid" in by(s, "key-note").text.lower(),
         "a wrong key was not refused in words")
    by(browser, "key").send_keys(KEY, Keys.ENTER)
    wait(browser, lambda s: len(Select(by(s, "target")).options) > 0, "the key did not unlock the page")
    assert not by(browser, "key-form").is_displayed()
    shown = translate(browser, "A man is riding a bike.")
    assert shown == api(keyed, "/v1/translate", {"texts": ["A man is riding a bike."], "targetLanguage": "de",
                                                 "sourceLanguage": "en"}, key=KEY).json()[
        "translations"][0]["hypotheses"][0]["text"]
    browser.execute_script("sessionStorage.clear()")
