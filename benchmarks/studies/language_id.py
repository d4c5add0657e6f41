"""Language identification for requests without a source language: py3langid, lingua and langdetect compared.

    python -m benchmarks.studies.language_id [--per-language N] [--out docs/benchmarks/language_id.md]

Why: a request that names no source language (DeepL's source_lang omitted, LibreTranslate's
source=auto) is routed to a model by the language its texts are in, so the identifier runs on every
such request, before any translation, on sentences that are often short. This script measures what
the choice between the libraries depends on:

* accuracy per language (en, de, fr: every source language in our data), answers mapped to ISO 639-1;
* accuracy on short texts (at most 20 characters) separately: Multi30k has none, so the held-out
  Tatoeba sentences supply real ones, and word prefixes of the Multi30k sentences (cut at a word
  boundary to at most 20 characters, a derived set) supply German ones;
* time per text: one single-text call each, timed one by one after a warm-up, in this one thread;
  the call that ranks every language (a router falls back to the most likely served one); and one
  call on 64 sentences joined (cut to 2,000 characters), for a server that detects once per request;
* load time and memory: each library in a fresh process (`--probe`), reading VmRSS / VmHWM from
  /proc/self/status before the import, after construction, after the first call and after the
  warm-up texts (lingua loads its language models lazily, on the calls that need them);
* the confidence of right and wrong answers, for the libraries that give a probability, so that a
  confidence floor can be chosen, and what routing (most likely served language; refuse a text
  confidently in an unserved one) would do at several floors.

Data (read from --data, default ../shared/data): Multi30k test_2016_flickr in en, de and fr (1,000
sentences each), and the Tatoeba English and French sentences of the held-out test split that
models/data.py defines (tatoeba_split_of: a hash of the English sentence; ~2 % of the pairs, never
used for training), each distinct sentence once. Tatoeba's file is sorted by English length, so its
last lines are its ~2,000 longest pairs (at least 68 characters), 95 % of them in the training split.
Texts are stripped of surrounding whitespace and otherwise sent as they are (French no-break spaces
included). `--per-language N` keeps N evenly spaced texts of each set (all by default).

Native thread pools are limited to one thread (set before any library loads): the machine is small
and shared, and the server's cores belong to ONNX Runtime.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from importlib.metadata import version
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
LANGS = ("en", "de", "fr")
SHORT = 20  # characters: a "short" text is at most this long
FLOORS = (0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
ROUTE_FLOORS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.95)
JOINED_TEXTS, JOINED_CHARS, JOINED_REQUESTS = 64, 2000, 5
WARMUP_EVERY = 25  # every 25th text of each set is classified once before timing starts
KEEP_BEGIN = "<!-- recommendation: written by hand, kept when this report is regenerated -->"
KEEP_END = "<!-- end of the recommendation -->"


# --------------------------------------------------------------------------------------------- data

@dataclass(frozen=True)
class TextSet:
    name: str  # as shown in the tables
    lang: str  # the language every text of the set is in (ISO 639-1)
    texts: list[str]


def read_lines(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 file, surrounding whitespace stripped."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def tatoeba_heldout(data: Path) -> dict[str, list[str]]:
    """Distinct English and French sentences of the held-out Tatoeba test split, in file order."""
    from models.data import tatoeba_split_of  # the training split's own rule, so nothing here was trained on

    english: dict[str, None] = {}
    french: dict[str, None] = {}
    for line in read_lines(data / "tatoeba-fra-eng" / "fra-eng.tsv"):
        en, fr = line.split("\t")[:2]
        if tatoeba_split_of(en) == "test":
            english[en.strip()] = None
            french[fr.strip()] = None
    return {"en": list(english), "fr": list(french)}


def word_prefix(text: str, limit: int = SHORT) -> str:
    """The longest run of whole leading words of `text` that fits in `limit` characters ('' if none)."""
    words, out = text.split(), ""
    for word in words:
        longer = f"{out} {word}" if out else word
        if len(longer) > limit:
            break
        out = longer
    return out


def evenly_spaced(texts: list[str], n: int | None) -> list[str]:
    """n texts spread over the whole list (all of them when n is None or not smaller)."""
    if n is None or n >= len(texts):
        return texts
    return [texts[i * len(texts) // n] for i in range(n)]


def load_sets(data: Path, per_language: int | None) -> list[TextSet]:
    multi30k = {lang: read_lines(data / "multi30k" / f"test_2016_flickr.{lang}") for lang in LANGS}
    tatoeba = tatoeba_heldout(data)
    sets = [TextSet(f"multi30k {lang}", lang, multi30k[lang]) for lang in LANGS]
    sets += [TextSet(f"tatoeba {lang}", lang, tatoeba[lang]) for lang in ("en", "fr")]
    for lang in LANGS:
        prefixes = [p for p in (word_prefix(t) for t in multi30k[lang]) if p]
        sets.append(TextSet(f"prefix {lang}", lang, prefixes))
    return [TextSet(s.name, s.lang, evenly_spaced(s.texts, per_language)) for s in sets]


def joined_requests(sets: list[TextSet]) -> list[TextSet]:
    """Per language, a few requests of 64 consecutive Multi30k sentences joined by newlines and cut to
    2,000 characters (what one detection per request would see)."""
    out = []
    for s in sets:
        if s.name.startswith("multi30k"):
            chunks = [s.texts[i:i + JOINED_TEXTS] for i in range(0, len(s.texts), JOINED_TEXTS)]
            texts = ["\n".join(chunk)[:JOINED_CHARS] for chunk in chunks[:JOINED_REQUESTS]]
            out.append(TextSet(f"joined {s.lang}", s.lang, texts))
    return out


# ------------------------------------------------------------------------------------- identifiers

Ranked = list[tuple[str, float]]


@dataclass(frozen=True)
class Identifier:
    top: Callable[[str], tuple[str | None, float]]  # (ISO 639-1 code or None, confidence)
    ranked: Callable[[str], Ranked] | None  # languages best first, where the library gives them


def _py3langid_plain() -> Identifier:
    import py3langid

    return Identifier(top=py3langid.classify, ranked=None)


def _py3langid_probs() -> Identifier:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    model = py3langid_constructor(LanguageIdentifier)(MODEL_FILE, norm_probs=True)
    return Identifier(top=model.classify, ranked=model.rank)


def py3langid_constructor(cls):
    """`from_pickled_model` (py3langid <= 0.3) where it exists, else `from_model_file` (0.4: .npz model)."""
    return getattr(cls, "from_pickled_model", None) or cls.from_model_file


def _lingua(low_accuracy: bool) -> Identifier:
    from lingua import LanguageDetectorBuilder

    builder = LanguageDetectorBuilder.from_all_languages()
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).build()

    def ranked(text: str) -> Ranked:
        return [(v.language.iso_code_639_1.name.lower(), v.value)
                for v in detector.compute_language_confidence_values(text) if v.value > 0]

    def top(text: str) -> tuple[str | None, float]:
        best = detector.compute_language_confidence_values(text)[0]  # all zero: no letters in the text
        return (best.language.iso_code_639_1.name.lower(), best.value) if best.value > 0 else (None, 0.0)

    return Identifier(top=top, ranked=ranked)


def _langdetect() -> Identifier:
    from langdetect import DetectorFactory, detect_langs
    from langdetect.lang_detect_exception import LangDetectException

    DetectorFactory.seed = 0  # langdetect samples n-grams at random; fixed, its answers repeat

    def ranked(text: str) -> Ranked:
        try:
            return [(guess.lang.split("-")[0], guess.prob) for guess in detect_langs(text)]
        except LangDetectException:  # no letters in the text
            return []

    def top(text: str) -> tuple[str | None, float]:
        values = ranked(text)
        return values[0] if values else (None, 0.0)

    return Identifier(top=top, ranked=ranked)


@dataclass(frozen=True)
class Candidate:
    name: str
    dist: str  # the distribution, for its version
    module: str  # imported on its own in the probe, so that import and construction are timed apart
    call: str  # what is timed, as the report shows it
    build: Callable[[], Identifier]
    probability: bool  # whether the confidence is a probability (raw scores are left out of that analysis)


CANDIDATES = {c.name: c for c in (
    Candidate("py3langid", "py3langid", "py3langid", "py3langid.classify(text) (raw score)",
              _py3langid_plain, probability=False),
    Candidate("py3langid norm_probs", "py3langid", "py3langid",
              "LanguageIdentifier.{ctor}(MODEL_FILE, norm_probs=True).classify(text)",
              _py3langid_probs, probability=True),
    Candidate("lingua high", "lingua-language-detector", "lingua",
              "from_all_languages().build().compute_language_confidence_values(text)[0]",
              lambda: _lingua(low_accuracy=False), probability=True),
    Candidate("lingua low", "lingua-language-detector", "lingua",
              "from_all_languages().with_low_accuracy_mode().build().compute_language_confidence_values(text)[0]",
              lambda: _lingua(low_accuracy=True), probability=True),
    Candidate("langdetect", "langdetect", "langdetect", "detect_langs(text)[0] (DetectorFactory.seed = 0)",
              _langdetect, probability=True),
)}


# ----------------------------------------------------------------------------- load time and memory

def proc_status_kib(key: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now; VmHWM: the peak so far)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def probe(name: str) -> dict:
    """In a fresh process: import, construct, first call, warm-up texts (from stdin, a JSON list), with
    the time each took and the resident memory after each. numpy is loaded first and not counted: the
    server has it loaded already (ONNX Runtime)."""
    texts = json.load(sys.stdin)
    import numpy  # noqa: F401

    candidate = CANDIDATES[name]
    out = {"rss_start": proc_status_kib("VmRSS"), "hwm_start": proc_status_kib("VmHWM")}
    t0 = time.perf_counter()
    importlib.import_module(candidate.module)
    t1 = time.perf_counter()
    identifier = candidate.build()
    t2 = time.perf_counter()
    out["rss_built"] = proc_status_kib("VmRSS")
    identifier.top(texts[0])
    t3 = time.perf_counter()
    out["rss_first"] = proc_status_kib("VmRSS")
    for text in texts:
        identifier.top(text)
    t4 = time.perf_counter()
    out.update(rss_warm=proc_status_kib("VmRSS"), hwm_end=proc_status_kib("VmHWM"),
               import_s=t1 - t0, build_s=t2 - t1, first_s=t3 - t2, warm_s=t4 - t3, warm_texts=len(texts))
    return out


def run_probe(name: str, texts: list[str]) -> dict:
    result = subprocess.run([sys.executable, "-m", "benchmarks.studies.language_id", "--probe", name],
                            input=json.dumps(texts), capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------ accuracy and speed

@dataclass(frozen=True)
class Answer:
    group: str  # the TextSet's name
    lang: str  # the truth
    text: str
    guess: str | None
    confidence: float
    ns: int  # the call's wall time


def warm_up(identifier: Identifier, sets: list[TextSet]) -> None:
    for s in sets:
        for text in s.texts[::WARMUP_EVERY]:
            identifier.top(text)


def classify_all(identifier: Identifier, sets: list[TextSet], label: str) -> list[Answer]:
    """Every text once, each call timed on its own."""
    answers = []
    for s in sets:
        t0 = time.perf_counter()
        for text in s.texts:
            start = time.perf_counter_ns()
            guess, confidence = identifier.top(text)
            elapsed = time.perf_counter_ns() - start
            answers.append(Answer(s.name, s.lang, text, guess, float(confidence), elapsed))
        print(f"  {label}: {s.name} ({len(s.texts)} texts, {time.perf_counter() - t0:.1f} s)",
              file=sys.stderr, flush=True)
    return answers


def ranking_us(identifier: Identifier, sets: list[TextSet]) -> float:
    """Mean time of the call that ranks every language (what a router that falls back to the most likely
    served language calls), on the Multi30k sentences, after the same warm-up."""
    texts = [t for s in sets if s.name.startswith("multi30k") for t in s.texts]
    for text in texts[::WARMUP_EVERY]:
        identifier.ranked(text)
    start = time.perf_counter_ns()
    for text in texts:
        identifier.ranked(text)
    return (time.perf_counter_ns() - start) / len(texts) / 1000


def served_fallbacks(identifier: Identifier, answers: list[Answer]) -> dict[str, str | None]:
    """For each text whose top answer is not en/de/fr: the most likely of en/de/fr in its ranking
    (None where the ranking names none of them), as a router restricted to served languages picks."""
    out: dict[str, str | None] = {}
    for a in answers:
        if a.guess not in LANGS and a.text not in out:
            likely = dict(identifier.ranked(a.text))
            best = max(LANGS, key=lambda lang: likely.get(lang, 0.0))
            out[a.text] = best if likely.get(best, 0.0) > 0 else None
    return out


# -------------------------------------------------------------------------------------- measures

def ratio(part: int, whole: int) -> float:
    return part / whole if whole else float("nan")


def accuracy(answers: list[Answer]) -> float:
    return ratio(sum(a.guess == a.lang for a in answers), len(answers))


def mean_us(answers: list[Answer]) -> float:
    return statistics.fmean(a.ns for a in answers) / 1000 if answers else float("nan")


def quantile_us(answers: list[Answer], q: float) -> float:
    ordered = sorted(a.ns for a in answers)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def share(values: list[float], predicate: Callable[[float], bool]) -> float:
    return ratio(sum(map(predicate, values)), len(values))


def confidences(answers: list[Answer]) -> tuple[list[float], list[float]]:
    """(confidences of right answers, of wrong ones)."""
    right = [a.confidence for a in answers if a.guess == a.lang]
    wrong = [a.confidence for a in answers if a.guess != a.lang]
    return right, wrong


def routed(answers: list[Answer], fallbacks: dict[str, str | None], floor: float) -> Counter:
    """Outcomes of routing among en/de/fr: a served top answer is used; an unserved one is refused when at
    least `floor` likely, otherwise the most likely served language is used."""
    outcome: Counter = Counter()
    for a in answers:
        if a.guess in LANGS:
            language = a.guess
        elif a.confidence >= floor:
            outcome["refused"] += 1
            continue
        else:
            language = fallbacks.get(a.text)
        outcome["right" if language == a.lang else "misrouted"] += 1
    return outcome


# -------------------------------------------------------------------------------------- report

def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f} %"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or "unknown CPU"
    return f"{model}, {len(os.sched_getaffinity(0))} cores"


def data_table(sets: list[TextSet]) -> str:
    rows = [[s.name, str(len(s.texts)), str(sum(len(t) <= SHORT for t in s.texts)),
             f"{statistics.fmean(len(t) for t in s.texts):.0f}"] for s in sets]
    return table(["set", "texts", f"≤ {SHORT} chars", "mean chars"], rows)


def accuracy_table(results: dict[str, list[Answer]], sets: list[TextSet]) -> str:
    names = [s.name for s in sets if not s.name.startswith("prefix")]
    rows = []
    for name, answers in results.items():
        cells = [pct(accuracy([a for a in answers if a.group == n])) for n in names]
        full = [a for a in answers if not a.group.startswith("prefix")]
        rows.append([name, *cells, f"**{pct(accuracy(full))}**"])
    return table(["library", *names, "all sentences"], rows)


def short_table(results: dict[str, list[Answer]]) -> str:
    groups = {
        f"tatoeba en ≤{SHORT}": lambda a: a.group == "tatoeba en" and len(a.text) <= SHORT,
        f"tatoeba fr ≤{SHORT}": lambda a: a.group == "tatoeba fr" and len(a.text) <= SHORT,
        "prefix en": lambda a: a.group == "prefix en",
        "prefix de": lambda a: a.group == "prefix de",
        "prefix fr": lambda a: a.group == "prefix fr",
        f"all ≤{SHORT}": lambda a: len(a.text) <= SHORT,
        f"all >{SHORT}": lambda a: len(a.text) > SHORT,
    }
    first = next(iter(results.values()))
    header = ["library"] + [f"{g} (n={sum(map(test, first))})" for g, test in groups.items()]
    rows = [[name] + [pct(accuracy([a for a in answers if test(a)])) for test in groups.values()]
            for name, answers in results.items()]
    return table(header, rows)


def confusion_table(results: dict[str, list[Answer]]) -> str:
    rows = []
    for name, answers in results.items():
        cells = []
        for lang in LANGS:
            wrong = Counter(a.guess or "none" for a in answers if a.lang == lang and a.guess != a.lang)
            cells.append(", ".join(f"{g} {n}" for g, n in wrong.most_common(4)) or "–")
        rows.append([name, *cells])
    return table(["library", "en texts taken for", "de texts taken for", "fr texts taken for"], rows)


def latency_table(results: dict[str, list[Answer]], joined: dict[str, list[Answer]],
                  ranking: dict[str, float]) -> str:
    rows = []
    for name, answers in results.items():
        short = [a for a in answers if len(a.text) <= SHORT]
        sentences = [a for a in answers if a.group.startswith("multi30k")]
        j = joined[name]
        rows.append([name, f"**{mean_us(answers):.0f}**", f"{quantile_us(answers, 0.5):.0f}",
                     f"{quantile_us(answers, 0.99):.0f}", f"{mean_us(short):.0f}", f"{mean_us(sentences):.0f}",
                     f"{ranking[name]:.0f}" if name in ranking else "–",
                     f"{64 * mean_us(sentences) / 1000:.1f}", f"{mean_us(j) / 1000:.2f}",
                     f"{pct(accuracy(j))} / {min(a.confidence for a in j):.2f}" if CANDIDATES[name].probability
                     else pct(accuracy(j))])
    return table(["library", "mean µs/text", "median", "p99", f"mean, ≤{SHORT} chars", "mean, Multi30k",
                  "ranking call, Multi30k", "64 Multi30k texts (ms)", "one joined call (ms)",
                  "joined: right / lowest confidence"], rows)


def growth_mib(probed: dict, key: str, base: str = "rss_start") -> str:
    return f"{(probed[key] - probed[base]) / 1024:.0f}"


def load_table(loads: dict[str, dict]) -> str:
    rows = []
    for name, p in loads.items():
        rows.append([name, f"{p['import_s'] * 1000:.0f}", f"{p['build_s'] * 1000:.0f}",
                     f"{p['first_s'] * 1000:.0f}", f"**{(p['import_s'] + p['build_s'] + p['first_s']):.2f}**",
                     growth_mib(p, "rss_built"), growth_mib(p, "rss_first"), f"**{growth_mib(p, 'rss_warm')}**",
                     growth_mib(p, "hwm_end", "hwm_start")])
    return table(["library", "import ms", "construct ms", "first call ms", "ready (s)", "RSS + MiB built",
                  "after 1st call", "after warm-up", "peak RSS + MiB"], rows)


def confidence_table(results: dict[str, list[Answer]]) -> str:
    rows = []
    for name, answers in results.items():
        right, wrong = confidences(answers)
        unserved = [a.confidence for a in answers if a.guess not in LANGS]
        rows.append([name, str(len(wrong)), f"**{pct(share(wrong, lambda c: c < 0.5))}**",
                     f"**{pct(share(right, lambda c: c < 0.5))}**",
                     f"{statistics.median(wrong):.2f}" if wrong else "–", f"{max(wrong):.2f}" if wrong else "–",
                     f"{max(unserved):.2f}" if unserved else "–",
                     f"{statistics.median(right):.2f}", f"{statistics.quantiles(right, n=20)[0]:.2f}"])
    return table(["library", "wrong answers", "wrong with conf < 0.5", "right with conf < 0.5",
                  "median conf, wrong", "highest, wrong", "highest, wrong and not en/de/fr",
                  "median conf, right", "5th pct conf, right"], rows)


def floor_table(results: dict[str, list[Answer]]) -> str:
    """Per floor: the share of wrong answers below it (rejected), of right ones (lost), of right short ones."""
    rows = []
    for name, answers in results.items():
        right, wrong = confidences(answers)
        short_right = [a.confidence for a in answers if len(a.text) <= SHORT and a.guess == a.lang]
        rows.append([name] + [" / ".join(pct(share(values, lambda c: c < floor)) for values in (wrong, right, short_right))
                              for floor in FLOORS])
    return table(["library"] + [f"below {floor:g}" for floor in FLOORS], rows)


def route_table(results: dict[str, list[Answer]], fallbacks: dict[str, dict[str, str | None]]) -> str:
    rows = []
    for name, answers in results.items():
        for floor in (*ROUTE_FLOORS, float("inf")):
            out = routed(answers, fallbacks[name], floor)
            short = routed([a for a in answers if len(a.text) <= SHORT], fallbacks[name], floor)
            total, n_short = len(answers), sum(short.values())
            rows.append([name, "never" if floor == float("inf") else f"{floor:g}",
                         pct(ratio(out["right"], total)), pct(ratio(out["refused"], total)),
                         pct(ratio(out["misrouted"], total)), pct(ratio(short["right"], n_short)),
                         pct(ratio(short["refused"], n_short))])
    return table(["library", "refuse unserved top at ≥", "routed right", "refused", "misrouted",
                  f"≤{SHORT} chars: right", f"≤{SHORT} chars: refused"], rows)


def kept_recommendation(path: Path) -> str:
    """The recommendation is a judgement on the figures, written by hand; a rerun keeps it."""
    if path.exists():
        text = path.read_text(encoding="utf-8")
        if KEEP_BEGIN in text and KEEP_END in text:
            return text[text.index(KEEP_BEGIN):text.index(KEEP_END) + len(KEEP_END)]
    return f"{KEEP_BEGIN}\n(to be written from the figures below)\n{KEEP_END}"


def versions() -> str:
    dists = [*dict.fromkeys(c.dist for c in CANDIDATES.values()), "numpy"]
    return ", ".join(f"{d} {version(d)}" for d in dists) + f", Python {platform.python_version()}"


def report(command: str, sets: list[TextSet], results: dict[str, list[Answer]], joined: dict[str, list[Answer]],
           ranking: dict[str, float], loads: dict[str, dict], fallbacks: dict[str, dict[str, str | None]],
           kept: str) -> str:
    from py3langid.langid import LanguageIdentifier

    ctor = py3langid_constructor(LanguageIdentifier).__name__
    calls = "\n".join(f"- {c.name}: `{c.call.format(ctor=ctor)}`" for c in CANDIDATES.values())
    with_probs = {n: a for n, a in results.items() if CANDIDATES[n].probability}
    return f"""# Language identification for routing: py3langid, lingua, langdetect

Produced by `{command}` on {machine()}, {date.today().isoformat()}, one thread.
Versions: {versions()}.

Calls measured (each text is one call; a text with no letters, for which a library has no answer, counts
as wrong):

{calls}

## Recommendation

{kept}

## Data

Multi30k test_2016_flickr (image captions) in the three languages; Tatoeba: the distinct English and
French sentences of the held-out test split of models/data.py (`tatoeba_split_of(english) == "test"`,
never trained on). Tatoeba's last 2,000 lines were not used: the file is sorted by English length,
so they are its longest sentences (none under 68 characters) and 95 % of them are in the training
split. "prefix": the leading words of each Multi30k sentence that fit in {SHORT} characters (derived;
the only short German texts at hand).

{data_table(sets)}

## Accuracy per language (sentences; prefixes are in the next table)

{accuracy_table(results, sets)}

## Accuracy on short texts

{short_table(results)}

What the wrong answers were (all sets, most frequent first):

{confusion_table(results)}

## Time per text (µs, single calls after a warm-up; this process, one thread)

"ranking call": the call that returns every language with its probability (py3langid `rank(text)`; the
full list for lingua; langdetect's `detect_langs`, the same call), timed over all Multi30k sentences
at once. "64 Multi30k texts" is 64 times the mean on Multi30k sentences (a full request, one call per text);
"one joined call" is one call on {JOINED_TEXTS} Multi30k sentences joined by newlines and cut to
{JOINED_CHARS} characters ({JOINED_REQUESTS} such requests per language).

{latency_table(results, joined, ranking)}

## Load time and memory (a fresh process per library)

Import, construction and first call (lingua loads language models on the calls that need them), then
the warm-up texts (every {WARMUP_EVERY}th text of each set). Memory: growth of VmRSS over the process
before the import (with numpy already loaded), and of VmHWM (peak).

{load_table(loads)}

## Confidence of right and wrong answers

All texts (sentences and short ones together). A floor rejects answers below it.

{confidence_table(with_probs)}

Rejected by a floor (answer below it), as "wrong answers / right answers / right answers on texts of at
most {SHORT} characters". Right answers are also the best guide at hand to how confident a library is
on a text in a language it knows well, such as an unserved language: the share of them at or above a
floor estimates the share of such texts that the floor would catch.

{floor_table(with_probs)}

## Routing among en, de and fr

As a router would use it: a top answer in en/de/fr is taken; an answer in another language is refused
when its confidence is at least the floor, and otherwise replaced by the most likely of en/de/fr in
the library's ranking (langdetect ranks only languages above 0.1). All texts are in a served language
here, so every refusal is a wrong one; what a floor saves (texts really in an unserved language, sent
to a model anyway) needs texts in other languages, which the data at hand does not have.

{route_table(with_probs, fallbacks)}
"""


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-language", type=int, default=None, metavar="N",
                   help="texts per set, evenly spaced (default: all)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "language_id.md")
    p.add_argument("--data", type=Path, default=DATA, help="folder with multi30k/ and tatoeba-fra-eng/")
    p.add_argument("--probe", choices=sorted(CANDIDATES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.probe)))
        return 0

    sets = load_sets(args.data, args.per_language)
    joined = joined_requests(sets)
    print("data: " + ", ".join(f"{s.name} {len(s.texts)}" for s in sets), file=sys.stderr, flush=True)
    warm_texts = [t for s in sets for t in s.texts[::WARMUP_EVERY]]

    loads = {}
    for name in CANDIDATES:
        print(f"load and memory: {name} (fresh process)", file=sys.stderr, flush=True)
        loads[name] = run_probe(name, warm_texts)

    results, joined_results, ranking, fallbacks = {}, {}, {}, {}
    for name, candidate in CANDIDATES.items():
        print(f"accuracy and time: {name}", file=sys.stderr, flush=True)
        identifier = candidate.build()
        warm_up(identifier, sets)
        results[name] = classify_all(identifier, sets, name)
        joined_results[name] = classify_all(identifier, joined, name)
        if candidate.probability and identifier.ranked is not None:
            ranking[name] = ranking_us(identifier, sets)
            fallbacks[name] = served_fallbacks(identifier, results[name])

    command = "python -m benchmarks.studies.language_id" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    text = report(command, sets, results, joined_results, ranking, loads, fallbacks, kept_recommendation(args.out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
