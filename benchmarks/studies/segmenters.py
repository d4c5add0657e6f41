"""Sentence segmenters compared for the server's document splitting: pysbd, sentencex, blingfire, syntok.

    python -m benchmarks.studies.segmenters            # writes docs/segmenters.md
    python -m benchmarks.studies.segmenters --no-write # prints the report only

Gold set: hand-written English, German and French paragraphs, each stored as its list of sentences. The
paragraph is those sentences joined by a space, except that a sentence that begins with whitespace carries
its own separator (a newline, a blank line, CRLF), so every gold boundary sits at a known character.

Boundaries are compared as the first non-space character of each sentence after the first, so a library
that puts the inter-sentence space at the end of one sentence or the start of the next is not penalised.
Each library is scored through the call that gives character offsets, because the server has to rebuild
the document byte for byte around the translated sentences; the plain call is checked for what it does to
the text. Everything runs in this one thread (the machine is small and shared).
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import version
from itertools import zip_longest
from pathlib import Path

# Before any library loads: keep native code (sentencex is Rust) from starting worker threads.
for _var in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

ROOT = Path(__file__).resolve().parents[2]
NB, NNB = "\u00a0", "\u202f"  # French typography: no-break space, narrow no-break space

EN = [
    ["Dr. Smith met Mr. Jones and Mrs. Brown at the station.", "They took the 5 p.m. train to Boston."],
    ["Some fruits, e.g. apples and pears, keep well.", "Others, i.e. berries, rot within days.", "Plan ahead."],
    ["The meeting starts at 9 a.m.", "Please be on time."],
    ["Pi is roughly 3.14, and the invoice came to $1,000.50.", "Both numbers were rounded."],
    ["I waited... and waited.", "Nobody came, so I don't know what happened."],
    ["She paused…", "Then she laughed.", "It was over."],
    ["He said, “Stop right there.”", "Nobody moved."],
    ["“Did she really say ‘I quit!’ in the meeting?” asked Tom.", "Nobody answered him."],
    ["The results were clear (see the appendix).", "(A second run confirmed them.)", "We stopped there."],
    ["The docs live at https://example.com/a.b?x=1 for now.", "Write to john.doe@example.co.uk with questions."],
    ["J. R. R. Tolkien wrote The Hobbit.", "It appeared in 1937."],
    ["Really?!", "You fixed it already?", "Wow!", "That was fast."],
    ["Shopping list:", "\n1. Buy milk.", "\n2. Call the bank.", "\n3. Pay the rent."],
    ["Introduction", "\nThis chapter describes the method.", "It has three parts."],
    ["The committee met on Tuesday.", "\n\nA new paragraph begins here.", "It is short."],
    ["This sentence was wrapped by an old edi-\ntor in the middle of a clause.", "The next one was not."],
    ["The U.S. economy grew 2.5% last year.", "Analysts at the U.N. were surprised."],
    ["We bought apples, pears, bananas, etc.", "The shop closed soon after."],
    ["Prof. Adams lives at No. 7 Baker St. in London.", "He moved there in Jan. 2020."],
    ["'Fine,' she said.", "'Let's go.'", "He called it a ‘disaster’.", "Few disagreed."],
    ["We shipped it 🎉!", "The court agreed [citation omitted].", "Everyone cheered."],
    ["First line of a Windows file.", "\r\nSecond line of it.", "\r\nThird line."],
]

DE = [
    ["Dr. Müller kam am 3. Oktober nach Berlin.", "Er blieb zwei Wochen."],
    ["Viele Obstsorten, z. B. Äpfel und Birnen, sind lange haltbar.", "Beeren, Kirschen usw. verderben schneller."],
    ["Wir brauchen Mehl, Zucker, Eier usw.", "Der Laden schließt um 18 Uhr."],
    ["Das Treffen beginnt um 10.30 Uhr im Raum 2.", "Bitte seien Sie pünktlich."],
    ["Die Rechnung beträgt 1.000,50 Euro, der Rabatt 3,14 Prozent.", "Zahlbar bis Ende des Monats."],
    ["Er sagte: „Ich komme morgen.“", "Dann ging er."],
    ["„Hast du ‚Faust‘ gelesen?“, fragte sie.", "Er nickte nur."],
    ["»Das ist unmöglich!«, rief der Direktor.", "Niemand widersprach."],
    ["Die Stadt bzw. der Landkreis trägt die Kosten.", "Das steht im Vertrag, d. h. es ist verbindlich."],
    ["Im 19. Jahrhundert wuchs die Stadt stark.", "Heute hat sie ca. 200.000 Einwohner."],
    ["Ich wartete ... und wartete.", "Niemand kam."],
    ["Sie zögerte …", "Dann unterschrieb sie.", "Der Vertrag war gültig."],
    ["Mehr unter https://example.de/info.html?id=7 oder per Mail an info@example.de.", "Wir antworten schnell."],
    ["Was soll das?!", "Das ist doch nicht dein Ernst!", "Hör sofort auf."],
    ["Tagesordnung:", "\n1. Begrüßung", "\n2. Bericht des Vorstands", "\n3. Verschiedenes"],
    ["Prof. Dr. Weber spricht auf S. 12 der Broschüre über Nr. 5 der Reihe.", "Der Eintritt ist frei."],
    ["Der Zug fährt am 24.12. um 14 Uhr ab.", "Die Frist endet am 31.12.", "Danach gilt die neue Regel."],
    ["Die Sitzung wurde vertagt.", "\n\nNeuer Abschnitt: Finanzen.", "Die Zahlen liegen vor."],
    ["Der Text wurde von einem alten Programm\nmitten im Satz umgebrochen.", "Der nächste Satz nicht."],
    ["Wir trafen Hrn. Schulz und Fr. Dr. Lange in der Goethestr. 5.", "Beide waren gut gelaunt."],
    ["Am 3. Oktober ist Feiertag.", "Am 4. arbeiten wieder alle."],
    ["Das Buch von J. R. R. Tolkien erschien 1954.", "Die deutsche Ausgabe kam später (ca. 1969)."],
]

FR = [
    ["M. Dupont et Mme Martin sont arrivés à 10 h.", "Ils sont repartis à midi."],
    ["Mme Leroy a rencontré M. Bernard hier.", "Ils ont parlé du projet."],
    ["Certains fruits, p. ex. les pommes, se conservent bien.", "D’autres, c.-à-d. les fraises, pourrissent vite."],
    ["Nous avons acheté des pommes, des poires, etc.", "Le magasin a fermé ensuite."],
    ["La valeur de π est environ 3,14.", f"La facture s’élève à 1{NNB}000,50 euros."],
    [f"Il a dit{NB}: «{NB}Je viendrai demain.{NB}»", "Puis il est parti."],
    ["« Tu viens ? » demanda-t-il.", "Elle ne répondit pas."],
    [f"«{NB}Quelle horreur{NB}!{NB}» s’écria-t-elle.", "Puis elle sortit."],
    ["J’ai attendu... et attendu.", "Personne n’est venu."],
    ["Elle hésita…", "Puis elle signa.", "Le contrat était valide."],
    ["Voir https://example.fr/a.b?x=1 pour les détails.", "Écrivez à marie.dupont@example.fr si besoin."],
    [f"Quoi{NNB}?!", f"Tu as déjà fini{NNB}?", f"Bravo{NNB}!", "C’était rapide."],
    ["Ordre du jour :", "\n1. Accueil des participants", "\n2. Rapport financier", "\n3. Questions diverses"],
    ["Le Dr. Lefèvre consulte le lundi.", "Le Pr Girard enseigne à Lyon."],
    ["Il est mort en 300 av. J.-C. à Rome.", "Sa tombe est perdue."],
    ["Rendez-vous le 3 oct. à 14 h 30.", "Apportez vos documents."],
    ["Le texte a été coupé par un vieil éditeur\nau milieu d’une phrase.", "La phrase suivante ne l’a pas été."],
    ["Fin du chapitre.", "\n\nUn nouveau paragraphe commence ici.", "Il est court."],
    ["L’article 5 (voir p. 12) s’applique.", "(Le cas est rare.)", "Passons à la suite."],
    ["J. R. R. Tolkien a écrit Le Hobbit.", "Le livre est paru en 1937."],
    ["Il répondit : « Elle m’a dit “jamais” hier. »", "On n’en parla plus."],
    ["Il cria « Au secours ! » et s’enfuit.", "La rue était vide."],
    ["Plusieurs langues (anglais, allemand, etc.) sont prises en charge.", "Cf. la section 2 pour la liste."],
]

GOLD = {"en": EN, "de": DE, "fr": FR}


def build(sentences: list[str]) -> tuple[str, set[int]]:
    """The paragraph text and its gold boundaries (first non-space character of each later sentence)."""
    text, starts = "", set()
    for i, sent in enumerate(sentences):
        if i and not sent[:1].isspace():
            text += " "
        if i:
            starts.add(len(text) + len(sent) - len(sent.lstrip()))
        text += sent
    return text, starts


def boundaries(text: str, spans: list[tuple[int, int]]) -> set[int]:
    """Span starts moved past whitespace, so only the choice of split point is judged, not where spaces go."""
    out = set()
    for start, _ in spans:
        while start < len(text) and text[start].isspace():
            start += 1
        if 0 < start < len(text):
            out.add(start)
    return out


def spans_cover(text: str, spans: list[tuple[int, int]]) -> bool:
    """True if the spans are in order, do not overlap, and leave out only whitespace."""
    pos = 0
    for start, end in spans:
        if start < pos or end < start or end > len(text) or text[pos:start].strip():
            return False
        pos = end
    return not text[pos:].strip()


def preservation(text: str, pieces: list[str]) -> str:
    """What the plain (string-returning) call did to the text, from best to worst."""
    if "".join(pieces) == text:
        return "verbatim"
    pos = 0  # sequential search: can each sentence be found where the previous one ended?
    for core in (p.strip() for p in pieces):
        at = text.find(core, pos) if core else pos
        if at < 0 or text[pos:at].strip():
            break
        pos = at + len(core)
    else:
        if not text[pos:].strip():
            return "locatable"
    joined = "".join(pieces)
    return "whitespace changed" if "".join(joined.split()) == "".join(text.split()) else "characters changed"


@dataclass
class Library:
    name: str
    dist: str
    languages: str
    offsets_call: str
    plain_call: str
    spans: Callable[[str, str], list[tuple[int, int]]]
    plain: Callable[[str, str], list[str]]


@cache
def _pysbd(lang: str, char_span: bool):
    import pysbd  # one Segmenter per language, built once, as a server would

    return pysbd.Segmenter(language=lang, clean=False, char_span=char_span)


def _syntok_spans(lang: str, text: str) -> list[tuple[int, int]]:
    from syntok import segmenter

    spans = []
    for paragraph in segmenter.analyze(text):
        for sentence in paragraph:
            tokens = [t for t in sentence if t.value]  # skip the empty end-of-text token
            spans.append((tokens[0].offset, tokens[-1].offset + len(tokens[-1].value)))
    return spans


def _syntok_plain(lang: str, text: str) -> list[str]:
    from syntok import segmenter  # process() is the README's call; it rewrites text (see report)

    return ["".join(map(str, s)) for p in segmenter.process(text) for s in p]


def _blingfire_spans(lang: str, text: str) -> list[tuple[int, int]]:
    import blingfire

    return list(blingfire.text_to_sentences_and_offsets(text)[1])


def _blingfire_plain(lang: str, text: str) -> list[str]:
    import blingfire

    return blingfire.text_to_sentences(text).split("\n")


def _sentencex_spans(lang: str, text: str) -> list[tuple[int, int]]:
    import sentencex

    return [(b["start_index"], b["end_index"]) for b in sentencex.get_sentence_boundaries(lang, text)]


def _sentencex_plain(lang: str, text: str) -> list[str]:
    import sentencex

    return list(sentencex.segment(lang, text))


LIBRARIES = [
    Library("pysbd", "pysbd", "23 languages; `language=` (en/de/fr all present)",
            "`Segmenter(language=l, clean=False, char_span=True).segment(t)`",
            "`Segmenter(language=l, clean=False).segment(t)`",
            lambda lang, text: [(s.start, s.end) for s in _pysbd(lang, True).segment(text)],
            lambda lang, text: _pysbd(lang, False).segment(text)),
    Library("sentencex", "sentencex", "~300 languages via fallback chains; language code argument",
            "`get_sentence_boundaries(l, t)`", "`segment(l, t)`", _sentencex_spans, _sentencex_plain),
    Library("blingfire", "blingfire", "no setting: one language-agnostic model",
            "`text_to_sentences_and_offsets(t)`", "`text_to_sentences(t)`", _blingfire_spans, _blingfire_plain),
    Library("syntok", "syntok", "no setting; abbreviation lists for en/de/es built in",
            "`segmenter.analyze(t)` token offsets", "`segmenter.process(t)`", _syntok_spans, _syntok_plain),
]


def score(lib: Library, cases: list[tuple[str, str, set[int]]], n_examples: int) -> dict:
    """Accuracy, boundary P/R/F1, offset validity and text preservation over the gold set."""
    exact: dict[str, list[bool]] = {lang: [] for lang in GOLD}
    flat: list[bool] = []  # paragraphs without a line break: the server may settle newlines by its own rule
    tp = fp = fn = bad_spans = 0
    plain: dict[str, int] = {}  # what the plain call did to the text -> paragraph count
    failures: list[tuple[str, str]] = []
    for lang, text, gold in cases:
        spans = lib.spans(lang, text)
        pred = boundaries(text, spans)
        tp, fp, fn = tp + len(pred & gold), fp + len(pred - gold), fn + len(gold - pred)
        exact[lang].append(pred == gold)
        if "\n" not in text:
            flat.append(pred == gold)
        bad_spans += not spans_cover(text, spans)
        how = preservation(text, lib.plain(lang, text))
        plain[how] = plain.get(how, 0) + 1
        if pred != gold:
            failures.append((lang, mark(text, gold, pred)))
    # Show spurious splits first (they cost translation most), spread over the languages.
    failures.sort(key=lambda f: "[+]" not in f[1])
    by_lang = [[f for f in failures if f[0] == lang] for lang in GOLD]
    shown = [f for group in zip_longest(*by_lang) for f in group if f][:n_examples]
    precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
    return {
        "exact": {lang: sum(v) / len(v) for lang, v in exact.items()},
        "exact_all": sum(sum(v) for v in exact.values()) / len(cases), "exact_flat": sum(flat) / len(flat),
        "p": precision, "r": recall, "f1": 2 * precision * recall / max(precision + recall, 1e-9),
        "bad_spans": bad_spans, "plain": plain, "failures": shown, "n_failed": len(failures),
    }


def mark(text: str, gold: set[int], pred: set[int]) -> str:
    """The text with `|` at right splits, `[+]` at spurious ones, `[-]` at missed ones; ⏎ for newlines."""
    out, last = [], 0
    for pos in sorted(gold | pred):
        tag = "|" if pos in gold and pos in pred else "[+]" if pos in pred else "[-]"
        out += [text[last:pos].rstrip(" "), f" {tag} "]
        last = pos
    out.append(text[last:])
    return "".join(out).replace("\r", "").replace("\n", "⏎")


def documents(cases: list[tuple[str, str, set[int]]], size: int) -> list[tuple[str, str]]:
    """One document per language of about `size` characters: its paragraphs, repeated, joined by blank
    lines. The server hands over whole documents, and a library's cost need not be linear in length."""
    docs = []
    for lang in GOLD:
        paras = [t for lg, t, _ in cases if lg == lang]
        reps = max(1, round(size / (sum(map(len, paras)) + 2 * len(paras))))
        docs.append((lang, "\n\n".join(paras * reps)))
    return docs


def throughput(lib: Library, cases: list[tuple[str, str, set[int]]], seconds: float,
               doc_chars: int) -> tuple[float, float]:
    """Characters/s of the offsets call, per paragraph and per long document."""
    docs = documents(cases, doc_chars)
    rates = []
    for units in ([(lang, text) for lang, text, _ in cases], docs):
        chars = sum(len(t) for _, t in units)
        for lang, text in units:  # warm-up: lazy imports, regex compilation, segmenter construction
            lib.spans(lang, text)
        best = 0.0
        for _ in range(3):  # best of three short rounds damps noise from the other users of the CPU
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 3:
                for lang, text in units:
                    lib.spans(lang, text)
                done += chars
            best = max(best, done / (time.perf_counter() - start))
        rates.append(best)
    return rates[0], rates[1]


def machine() -> str:
    """The CPU model as `lscpu` names it, since speeds are only comparable on the same one."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


KEEP_BEGIN = "<!-- written by hand: kept when the report is regenerated -->"
KEEP_END = "<!-- end of the hand-written part -->"


def kept_section(path: Path) -> str:
    """The recommendation is prose judged against the numbers, so it lives in the report and is carried over
    on each run instead of being generated (a rerun should not silently change a human conclusion)."""
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    if KEEP_BEGIN in old and KEEP_END in old:
        return old[old.index(KEEP_BEGIN):old.index(KEEP_END) + len(KEEP_END)]
    return f"{KEEP_BEGIN}\n## Recommendation\n\n(to write, against the table above)\n{KEEP_END}"


def report(results: list[tuple[Library, dict]], cases: list, command: str, doc_chars: int, by_hand: str) -> str:
    n = {lang: sum(1 for c in cases if c[0] == lang) for lang in GOLD}
    n_flat = sum(1 for c in cases if "\n" not in c[1])
    lines = [
        "# Sentence segmenters for document splitting",
        "",
        f"Produced by `{command}` on {machine()}, Python {platform.python_version()}, one thread. Gold set: "
        f"{len(cases)} hand-written paragraphs ({n['en']} en, {n['de']} de, {n['fr']} fr, "
        f"{sum(len(g) for _, _, g in cases)} boundaries) in `benchmarks/studies/segmenters.py`: abbreviations, decimals "
        "and thousands separators, ellipses, quotes and nested quotes, sentences ending in quotes or brackets, "
        "URLs, e-mail addresses, list items, German ordinals and times, initials, `?!`, French no-break spaces, "
        "newlines, CRLF, an emoji.",
        "",
        "Exact = share of paragraphs with every boundary right; \"no newline\" counts only the "
        f"{n_flat} paragraphs without a line break (the newline cases expect a split after a heading or list "
        "line and none inside a hard-wrapped sentence, a policy the server may apply itself). P/R/F1 over "
        "boundaries (a boundary is the first non-space character of a sentence, so where a library puts the "
        "spaces does not count). chars/s of the offsets call, best of 3: called per paragraph, and called on one "
        f"document per language of about {doc_chars:,} characters (its paragraphs repeated, joined by blank "
        "lines). Offsets = paragraphs whose spans are in order and leave out nothing but whitespace. Plain call "
        "= what the string-returning call does to the text: verbatim (sentences concatenate to the input), "
        "locatable (only whitespace between sentences dropped; sequential search finds every sentence), "
        "whitespace changed or characters changed.",
        "",
        "| library | version | languages | exact en | exact de | exact fr | exact all | exact, no newline | P | R "
        f"| F1 | chars/s paragraph | chars/s {doc_chars // 1000}k doc | offsets (call) | plain call output |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lib, r in results:
        plain = ", ".join(f"{k} {v}" for k, v in sorted(r["plain"].items(), key=lambda kv: -kv[1]))
        exact = " | ".join(f"{r['exact'][lang]:.0%}" for lang in GOLD)
        lines.append(
            f"| {lib.name} | {version(lib.dist)} | {lib.languages} | {exact} | **{r['exact_all']:.0%}** "
            f"| {r['exact_flat']:.0%} | {r['p']:.3f} | {r['r']:.3f} | **{r['f1']:.3f}** "
            f"| {r['rate'][0]:,.0f} | {r['rate'][1]:,.0f} "
            f"| {len(cases) - r['bad_spans']}/{len(cases)} valid: {lib.offsets_call} | {lib.plain_call}: {plain} |")
    lines += ["", by_hand, "", "## Failure cases",
              "", "`|` right split, `[+]` spurious split, `[-]` missed split, `⏎` newline.", ""]
    for lib, r in results:
        lines += [f"**{lib.name}** ({r['n_failed']} of {len(cases)} paragraphs wrong):", ""]
        lines += [f"- {lang}: `{text}`" for lang, text in r["failures"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.6, help="timing budget per library and mode (default 0.6)")
    ap.add_argument("--doc-chars", type=int, default=20000, help="length of the long documents (default 20000)")
    ap.add_argument("--examples", type=int, default=8, help="failure examples shown per library (default 8)")
    ap.add_argument("--only", nargs="*", choices=[lib.name for lib in LIBRARIES], help="libraries to run")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "segmenters.md", help="report path")
    ap.add_argument("--no-write", action="store_true", help="print the report instead of writing --out")
    args = ap.parse_args(argv)

    cases = [(lang, *build(sents)) for lang, paras in GOLD.items() for sents in paras]
    results = []
    for lib in LIBRARIES:
        if args.only and lib.name not in args.only:
            continue
        r = score(lib, cases, args.examples)
        r["rate"] = throughput(lib, cases, args.seconds, args.doc_chars)
        print(f"{lib.name:10s} exact {r['exact_all']:.0%}  F1 {r['f1']:.3f}  "
              f"{r['rate'][0]:,.0f} / {r['rate'][1]:,.0f} chars/s", flush=True)
        results.append((lib, r))
    command = " ".join([".venv/bin/python -m benchmarks.studies.segmenters", *(sys.argv[1:] if argv is None else argv)])
    text = report(results, cases, command, args.doc_chars, kept_section(args.out))
    if args.no_write:
        print(text)
    else:
        args.out.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
