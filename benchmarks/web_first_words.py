"""Time from pressing Translate to the first streamed words on the translator page, measured in the browser.

    python -m benchmarks.web_first_words [--tries 20] [--out docs/benchmarks/web_first_words.md]

Issue 61's target: p50 <= 100 ms over 20 tries, default flags, the shipped model, an idle server. The
server runs through the harness (`python -m server`, default flags, the shipped models); a headless
Chromium (benchmarks/browser.py) opens `/?source=en&target=de` and, for each try, types a different
test sentence (Multi30k test_2016_flickr, the first --tries after the warm-up ones) and clicks Translate.
The page itself records, with performance.now(), the time from the click's handler to the animation
frame after the first delta was inserted (`data-first-words-ms` on the output: the frame that paints
the words) and the time to the final message.

Baseline in the same run, the same sentences: the API alone, from Python (httpx, a kept-alive
connection): POST /v1/translate:stream until its first `data:` event and until the last one. The
difference is what the browser and the page add.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

from benchmarks.browser import start_chromium
from benchmarks.harness import ServerProcess, date_line, machine_line, serve_level
from tests.serving import flickr_sentences

ROOT = Path(__file__).resolve().parents[1]
WARM = 3  # tries not counted: the first loads of the model's pages and the first calls
TARGET_MS = 100.0


def page_tries(session, base: str, sentences: list[str]) -> list[tuple[float, float]]:
    """(first words ms, whole translation ms) per sentence, as the page measured them."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    session.get(base + "/?source=en&target=de")
    WebDriverWait(session, 60).until(lambda s: s.find_element(By.ID, "target").get_attribute("value") == "de")
    out = []
    for sentence in sentences:
        session.execute_script("const t = document.getElementById('text'); t.value = arguments[0];"
                               "t.dispatchEvent(new Event('input'));", sentence)
        session.execute_script("document.getElementById('translate').click()")
        output = session.find_element(By.ID, "output")
        WebDriverWait(session, 60, poll_frequency=0.01).until(
            lambda s: output.get_attribute("data-done") and output.get_attribute("data-first-words-ms"))
        whole = session.execute_script("return performance.getEntriesByType('resource').filter("
                                       "(e) => e.name.endsWith('/v1/translate:stream')).pop().duration")
        out.append((float(output.get_attribute("data-first-words-ms")), float(whole)))
    return out


def api_tries(base: str, sentences: list[str]) -> list[tuple[float, float]]:
    """(first event ms, last event ms) per sentence through the API alone."""
    out = []
    with httpx.Client(base_url=base, timeout=60) as client:
        for sentence in sentences:
            t0 = time.perf_counter()
            first = None
            body = {"text": sentence, "sourceLanguage": "en", "targetLanguage": "de"}
            with client.stream("POST", "/v1/translate:stream", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data:") and first is None:
                        first = time.perf_counter() - t0
            out.append((first * 1000, (time.perf_counter() - t0) * 1000))
    return out


def status_under_load(session, server: ServerProcess, seconds: float, shot: Path) -> dict:
    """The status page open while 8 streams load the server (the load generator, harness.serve_level) for
    `seconds`, then a quiet 4 s; its screenshot saved to `shot`. Returns the load generator's figures."""
    from selenium.webdriver.common.by import By

    session.set_window_size(1280, 900)
    session.get(server.http_url + "/status?every=1")
    time.sleep(3)  # an idle stretch before the load, as the plot will show it
    figures = serve_level(server.target, "stream:8", seconds)
    time.sleep(4)
    session.execute_script("window.scrollTo(0, 0)")
    shot.parent.mkdir(parents=True, exist_ok=True)
    session.save_screenshot(str(shot))
    figures["page_peak_tokens_per_s"] = float(session.find_element(By.ID, "plot").get_attribute("data-peak-rate"))
    return figures


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"p50": statistics.median(values), "p90": values[int(0.9 * (len(values) - 1))], "max": values[-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20, help="timed tries (after %d warm-up ones)" % WARM)
    parser.add_argument("--out", default="", help="write the report (markdown, and .json beside it)")
    parser.add_argument("--status-seconds", type=float, default=20.0,
                        help="then load the server with 8 streams this long with the status page open, and save "
                             "its screenshot beside --out (web_status.png); 0: skip")
    args = parser.parse_args(argv)
    sentences = flickr_sentences(WARM + args.tries)
    server = ServerProcess(http_port=0).start()
    session = start_chromium()
    try:
        page_tries(session, server.http_url, sentences[:WARM])
        api_tries(server.http_url, sentences[:WARM])
        page = page_tries(session, server.http_url, sentences[WARM:])
        alone = api_tries(server.http_url, sentences[WARM:])
        shot = Path(args.out).with_name("web_status.png") if args.out else ROOT / "build" / "web_status.png"
        load = status_under_load(session, server, args.status_seconds, shot) if args.status_seconds > 0 else None
    finally:
        session.quit()
        server.stop()
    result = {"tries": args.tries, "page_first_words_ms": summary([p[0] for p in page]),
              "page_stream_ms": summary([p[1] for p in page]),
              "api_first_event_ms": summary([a[0] for a in alone]), "api_stream_ms": summary([a[1] for a in alone]),
              "raw": {"page": page, "api": alone}, "status_under_load": load}
    lines = ["# First words on the translator page", "",
             f"`python -m benchmarks.web_first_words --tries {args.tries}` (benchmarks/web_first_words.py says how)."
             , "", date_line(), machine_line("headless Chromium, the server with default flags, shipped models"), "",
             "| ms | p50 | p90 | max |", "|---|---|---|---|"]
    for label, key in (("page: click to the first words painted", "page_first_words_ms"),
                       ("page: the stream request, whole (Resource Timing)", "page_stream_ms"),
                       ("API alone (httpx): request to the first event", "api_first_event_ms"),
                       ("API alone (httpx): the whole stream", "api_stream_ms")):
        s = result[key]
        lines.append(f"| {label} | {s['p50']:.1f} | {s['p90']:.1f} | {s['max']:.1f} |")
    verdict = "met" if result["page_first_words_ms"]["p50"] <= TARGET_MS else "missed"
    lines += ["", f"Target (issue 61): p50 <= {TARGET_MS:.0f} ms for the first words on the page: {verdict}."]
    if load is not None:
        lines += ["", f"Then the status page, open while 8 streams loaded the server for {args.status_seconds:.0f} s "
                      f"(the load generator served {load['tokens_per_s']:.0f} tokens/s; the page's plot peaked at "
                      f"{load['page_peak_tokens_per_s']:.0f} tokens/s over a 1 s sample):", "",
                  "![The status page under load](web_status.png)"]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        Path(args.out).with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
