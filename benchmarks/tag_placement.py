"""How often inline HTML tags land on the right words after translation.

    python -m benchmarks.tag_placement [--bundle model_repository/multi30k-en-de-small/4] \\
        [--out docs/benchmarks/tag_placement.md]

A hand-labelled set: English captions with one inline element around a word or
phrase, and the German stem(s) a correct translation of that word contains. Each
sentence goes through the server's HTML path (server/documents/html.py: the tags are
removed, the sentence translated, the tags put back at the same relative word
position), decoded greedily with the static ONNX decoder (the server's tokens). A
tag "lands right" when the text inside it contains an expected stem; "exact" when it
also contains nothing but that word (and its article/adjective ending). Words the
model did not translate as expected are counted apart, since no placement could put
the tag around a word that is not there.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from models.core import static_decode
from models.core.bundle import load_bundle, newest_version
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.tokenizer import load_tokenizer
from server.documents.html import plan_html

ROOT = Path(__file__).resolve().parents[1]

# (English with one inline element, German stems that belong inside it)
CASES = [
    ("A man in a <b>red</b> shirt is riding a bike.", ["rot"]),
    ("Two <b>dogs</b> are playing in the snow.", ["hund"]),
    ("A <i>woman</i> is walking down the street.", ["frau"]),
    ("A little girl is <b>climbing</b> a tree.", ["klettert"]),
    ("A man is playing the <b>guitar</b> on stage.", ["gitarre"]),
    ("Children are playing on the <b>beach</b>.", ["strand"]),
    ("A <b>black</b> dog runs through the grass.", ["schwarz"]),
    ('A man is sitting on a <a href="#x">bench</a> in the park.', ["bank"]),
    ("A <b>young boy</b> jumps into the water.", ["junge"]),
    ("A woman with a <b>blue</b> umbrella walks in the rain.", ["blau"]),
    ("The <i>old man</i> is reading a newspaper.", ["mann"]),
    ("A group of people are <b>standing</b> outside a building.", ["steh"]),
    ("A dog is catching a <b>ball</b> in the air.", ["ball"]),
    ("A man rides a <b>horse</b> on the beach.", ["pferd"]),
    ("Two women are <b>talking</b> on the street.", ["unterhalt", "sprech", "red"]),
    ("A boy is eating an <b>apple</b>.", ["apfel"]),
    ("A cyclist wearing a <b>helmet</b> rides down a hill.", ["helm"]),
    ("A girl in a <b>pink</b> dress is dancing.", ["rosa", "pink"]),
    ("A man is cooking in the <b>kitchen</b>.", ["küche"]),
    ("People are sitting at a <b>table</b> in a restaurant.", ["tisch"]),
    ("A <em>small</em> child is sleeping on a couch.", ["klein"]),
    ("A man in a <span class='c'>yellow</span> jacket is working.", ["gelb"]),
    ("Three men are <b>running</b> in a race.", ["lauf", "renn"]),
    ("A woman is holding a <b>baby</b> in her arms.", ["baby", "kind"]),
]
_INNER = re.compile(r"<(b|i|a|em|span)\b[^>]*>(.*?)</\1>", re.S)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "tag_placement.md"))
    args = p.parse_args()
    bundle = load_bundle(Path(args.bundle))
    tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
    model = OnnxModel(bundle, RuntimeOptions(intra_op_threads=1))
    plans = [plan_html(text, "on", "en", lambda s: True) for text, _ in CASES]
    sources = [u.source for plan in plans for u in plan.units]
    ids, mask = static_decode.pad_batch([tok.encode(s) for s in sources], bundle.spec.pad_id)
    outputs = iter(tok.decode(o) for o in static_decode.greedy(model, ids, mask))
    rows, right, exact, missing = [], 0, 0, 0
    for (text, stems), plan in zip(CASES, plans):
        out = plan.render([next(outputs) for _ in plan.units])
        inner = _INNER.search(out)
        inside = inner.group(2).lower() if inner else ""
        present = any(s in out.lower() for s in stems)
        ok = any(s in inside for s in stems)
        tight = ok and len(inside.split()) <= 2
        right += ok
        exact += tight
        missing += not present
        verdict = "right" if ok else ("word not in the translation" if not present else "wrong words")
        rows.append(f"| {text.replace('|', '/')} | {out.replace('|', '/')} | {verdict}{' (exact)' if tight else ''} |")
    n = len(CASES)
    lines = ["# Inline tags after translation", "",
             f"`python -m benchmarks.tag_placement`; model `{bundle.name}`, greedy, static ONNX decoder. Method: "
             "tags removed before translation and put back at the same relative word position "
             "(server/documents/placeholders.py). Hand-labelled set of "
             f"{n} captions with one inline element each.", "",
             f"- the tag surrounds an expected word: **{right}/{n}** ({right / n:.0%}); of those, tightly "
             f"(≤ 2 words inside): {exact}",
             f"- the model did not produce any expected word (no placement could be right): {missing}",
             f"- where the expected word is there: {right}/{n - missing} "
             f"({right / max(n - missing, 1):.0%})", "",
             "| source | output | tag |", "|---|---|---|"] + rows
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:9]))


if __name__ == "__main__":
    main()
