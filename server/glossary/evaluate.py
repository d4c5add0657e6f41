"""Glossary enforcement measured on the shipped models: term coverage, BLEU, untouched sentences.

    python -m server.glossary.evaluate --split val --pairs de,fr --modes greedy,beam5
    python -m server.glossary.evaluate --split test_2016_flickr --configs none,placeholder,chosen

The glossary test set is built from held-out sentences, with no human in the loop:
  1. a bilingual word list from the training split alone (29,000 pairs): for each English content
     word seen in >= 5 sentences (stop words out), the target word whose sentence co-occurrence
     with it has the highest Dice coefficient, 2 c(e,t) / (c(e) + c(t)), kept when >= 0.3 and
     seen together >= 3 times; the target language's function words (articles, prepositions,
     pronouns: TARGET_STOP) are never candidates;
  2. for each held-out sentence, its glossary: every English word of the sentence that has an
     entry whose target word occurs in the reference translation (case-insensitively), the entry
     being (the English word, the target word as the reference writes it), at most 3 a sentence.
So every term occurs in its source sentence and its translation is the reference's. A term is
covered when the output shows it as whole words (server/glossary/matching.py `appears`).

Configurations: `none` (no glossary), `force` (a term begun by the model is completed, no bonus,
ends allowed), `bonusN` (force + a bonus of N on pending terms' first tokens; `+eos` adds the end
insertion, `+rampR` grows the bonus by R per token past `+fromF` x the source's length, `+rewind` sends
a greedy row back to the likeliest place of a term it never began, server/core/term_placement.py), `chosen` (the
server's settings, server/core/terms.py SETTINGS), `placeholder` (the simplest baseline: each
source term replaced by a placeholder the document pipeline takes out and puts back by word
position, then the placeholder replaced by the target term). Decoding runs in this process, on
the engine's own scheduler and choice code (one thread; nothing else runs alongside).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
MODELS = {"de": ROOT / "model_repository" / "multi30k-en-de-small", "fr": ROOT / "model_repository" /
          "multi30k-en-fr-small"}
STOP = set("""a an the and or but of in on at to for with by from into onto over under up down out off
about as is are was were be been being it its this that these those there their they them he she his her
him we our you your i my me who whom which what while near next some one two three four five several many
other another each all both very just not no while than then so if because""".split())
# Function words of the target languages (3+ letters), never a term's translation.
TARGET_STOP = {"de": set("""der die das den dem des ein eine einer einem einen eines und mit auf von vor hinter
neben zwischen unter über für aus bei nach zum zur ist sind wird werden hat haben sich ihr ihre ihren ihrem ihrer
sein seine seinen seinem seiner einige etwas während wie als noch auch nicht oder aber dass sie ihm ihn durch
gegen ohne entlang andere anderen anderer anderes beim vom ins ans dabei daneben""".split()),
               "fr": set("""les des une est sont dans sur avec pour par qui que son ses leur leurs aux cette ces
devant derrière sous entre près alors tout tous toute toutes autre autres elle elles ils lui font fait être
pendant vers chez sans contre très peu plus une""".split())}
_WORD = re.compile(r"[^\W\d_]+")


def read(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def word_list(target: str, min_count: int = 5, min_dice: float = 0.3) -> dict[str, str]:
    """English word -> its best target word (lower case), from the training split's co-occurrences."""
    src, tgt = read("train.en"), read(f"train.{target}")
    sw = [{w for w in _WORD.findall(s.lower()) if len(w) >= 3 and w not in STOP} for s in src]
    tw = [{w for w in _WORD.findall(t.lower()) if len(w) >= 3} for t in tgt]
    ce, ct = collections.Counter(), collections.Counter()
    for a, b in zip(sw, tw):
        ce.update(a)
        ct.update(b)
    common = TARGET_STOP[target]
    keep_e = {w for w, n in ce.items() if n >= min_count}
    keep_t = {w for w, n in ct.items() if n >= min_count and w not in common}
    both = collections.Counter()
    for a, b in zip(sw, tw):
        a, b = a & keep_e, b & keep_t
        both.update((e, t) for e in a for t in b)
    best: dict[str, tuple[float, str]] = {}
    for (e, t), n in both.items():
        if n < 3:
            continue
        dice = 2 * n / (ce[e] + ct[t])
        if dice >= min_dice and dice > best.get(e, (0.0, ""))[0]:
            best[e] = (dice, t)
    return {e: t for e, (_, t) in best.items()}


def test_set(split: str, target: str, words: dict[str, str], per_sentence: int = 3):
    """[(source, reference, [(source term, target term)])] for every sentence of the split."""
    out = []
    for src, ref in zip(read(f"{split}.en"), read(f"{split}.{target}")):
        ref_words = {w.lower(): w for w in _WORD.findall(ref)}
        entries, seen = [], set()
        for w in _WORD.findall(src):
            e = w.lower()
            t = words.get(e)
            if t is None or e in seen or t not in ref_words:
                continue
            seen.add(e)
            entries.append((e, ref_words[t]))
            if len(entries) == per_sentence:
                break
        out.append((src, ref, entries))
    return out


class Decoder:
    """A served model's engine in this process, driven step by step (no threads)."""

    def __init__(self, pair: str, rows: int = 64, repository: Path = ROOT / "model_repository"):
        from models.core.bundle import discover
        from server.config import ServerConfig
        from server.frontend.hosted import HostedModel
        from server.observability.metrics import Metrics
        cfg = ServerConfig(max_batch_size=rows, max_queue_size=100_000, warmup=False, intra_op_threads=1,
                           max_batch_tokens=8192)
        bundle = [b for b in discover(repository) if b.target_language == pair][0]
        self.model = HostedModel(bundle, cfg, Metrics())

    def translate(self, texts: list[str], glossaries: list | None, beam: int) -> tuple[list[str], list[list[int]], float]:
        from server.core.request import DecodingParams, FinishEvent
        from server.glossary.matching import Matcher, terms_for
        model = self.model
        params = DecodingParams(beam_size=beam)
        results: dict[int, list[int]] = {}

        def sink_for(i):
            def sink(event):
                if isinstance(event, FinishEvent):
                    results[i] = list(event.hypotheses[0].tokens)
            return sink
        jobs = model.jobs(texts, params, [sink_for(i) for i in range(len(texts))], None)
        if glossaries is not None:
            for i, (job, entries) in enumerate(zip(jobs, glossaries)):
                if entries:
                    (job.terms,), _ = terms_for([texts[i]], Matcher(entries), model.tok, model.bundle.spec.unk_id)
        model.here.scheduler.submit(jobs)
        t0 = time.perf_counter()
        while len(results) < len(texts):
            model.here.loop.iteration(time.monotonic())
        seconds = time.perf_counter() - t0
        ids = [results[i] for i in range(len(texts))]
        return [model.tok.decode(t) for t in ids], ids, seconds


def placeholder_inputs(sentences, glossaries):
    """Each source term replaced by {gK}; returns (clean text, restore) per sentence."""
    from server.texts.placeholders import protect
    from server.glossary.matching import Matcher
    out = []
    for text, entries in zip(sentences, glossaries):
        if not entries:
            out.append((text, None, {}))
            continue
        found = Matcher(entries).find(text)
        marked, pos, targets = [], 0, {}
        for k, m in enumerate(found):
            marked.append(text[pos:m.start])
            marked.append(f"{{g{k}}}")
            targets[f"{{g{k}}}"] = m.target
            pos = m.end
        marked.append(text[pos:])
        clean, restore = protect("".join(marked))
        out.append((clean, restore, targets))
    return out


def evaluate(pair: str, split: str, modes: list[str], configs: list[str], limit: int = 0,
             repository: Path = ROOT / "model_repository") -> list[dict]:
    import sacrebleu
    from server.core import terms as enforce
    from server.glossary.matching import appears
    data = test_set(split, pair, word_list(pair))
    if limit:
        data = data[:limit]
    sources, refs, glossaries = [s for s, _, _ in data], [r for _, r, _ in data], [g for _, _, g in data]
    decoder = Decoder(pair, repository=repository)
    rows = []
    for mode in modes:
        beam = int(mode[4:]) if mode.startswith("beam") else 1
        plain, plain_ids, _ = decoder.translate(sources, None, beam)
        for config in configs:
            saved = dataclasses.replace(enforce.SETTINGS)
            if config == "none":
                outputs, ids, seconds = decoder.translate(sources, None, beam)
            elif config == "placeholder":
                prepared = placeholder_inputs(sources, glossaries)
                texts, _, seconds = decoder.translate([p[0] for p in prepared], None, beam)
                outputs = []
                for text, (_, restore, targets) in zip(texts, prepared):
                    text = restore(text) if restore else text
                    for mark, target in targets.items():
                        text = text.replace(mark, target)
                    outputs.append(text)
                ids = None
            else:
                parts = config.split("+")
                if parts[0] != "chosen":  # force / bonusN, then +eos, +rampR, +fromF in any order
                    enforce.SETTINGS.bonus = 0.0 if parts[0] == "force" else float(parts[0][5:])
                    enforce.SETTINGS.at_eos = "on" if "eos" in parts else "off"
                    enforce.SETTINGS.ramp = next((float(x[4:]) for x in parts if x.startswith("ramp")), 0.0)
                    enforce.SETTINGS.ramp_from = next((float(x[4:]) for x in parts if x.startswith("from")),
                                                      saved.ramp_from)
                    enforce.SETTINGS.rewind = "rewind" in parts
                try:
                    outputs, ids, seconds = decoder.translate(sources, glossaries, beam)
                finally:
                    enforce.SETTINGS.restore(saved)
            terms = [(t, out) for out, entries in zip(outputs, glossaries) for _, t in entries]
            covered = sum(appears(t, out) for t, out in terms)
            without = [i for i, g in enumerate(glossaries) if not g]
            same = sum(ids[i] == plain_ids[i] for i in without) if ids is not None else \
                sum(outputs[i] == plain[i] for i in without)
            rows.append({"pair": f"en-{pair}", "model": decoder.model.name, "mode": mode, "config": config,
                         "terms": len(terms),
                         "coverage": covered / max(len(terms), 1),
                         "bleu": sacrebleu.corpus_bleu(outputs, [refs]).score,
                         "untouched_identical": f"{same}/{len(without)}",
                         "mean_words": sum(len(o.split()) for o in outputs) / len(outputs),
                         "seconds": seconds})
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def fifty_terms(pair: str, n: int = 50) -> list[tuple[str, str]]:
    """The n most frequent English words of the word list, each with its translation as the training
    split writes it most often (German nouns capitalised)."""
    words = word_list(pair)
    counts = collections.Counter(w for s in read("train.en") for w in _WORD.findall(s.lower()))
    forms = collections.Counter(w for t in read(f"train.{pair}") for w in _WORD.findall(t))
    surface: dict[str, str] = {}
    for w, _ in forms.most_common():
        surface.setdefault(w.lower(), w)
    top = sorted((w for w in words if w in counts), key=lambda w: -counts[w])[:n]
    return [(w, surface.get(words[w], words[w])) for w in top]


def throughput(pair: str, split: str, rounds: int = 5, beam: int = 1,
               repository: Path = ROOT / "model_repository") -> dict:
    """Tokens/s of decoding the split (greedy, or beam search of width `beam`) with one 50-term glossary
    against none (matching and term tokenisation included), alternating rounds; and whether the sentences
    the glossary does not touch decode token for token as without it."""
    from server.glossary.matching import Matcher, appears, terms_for
    entries = fifty_terms(pair)
    sources = read(f"{split}.en")
    decoder = Decoder(pair, repository=repository)
    tok, unk = decoder.model.tok, decoder.model.bundle.spec.unk_id
    plain_rates, glossary_rates = [], []
    for _ in range(rounds):
        outputs, plain_ids, seconds = decoder.translate(sources, None, beam)
        plain_rates.append(sum(map(len, plain_ids)) / seconds)
        t0 = time.perf_counter()
        matcher = Matcher(entries)
        _, matches = terms_for(sources, matcher, tok, unk)
        prepare = time.perf_counter() - t0
        glossed, ids, seconds = decoder.translate(sources, [entries] * len(sources), beam)
        glossary_rates.append(sum(map(len, ids)) / (seconds + prepare))
    untouched = [i for i, m in enumerate(matches) if not m]
    found = [(m.target, glossed[i]) for i, ms in enumerate(matches) for m in ms]
    return {"pair": f"en-{pair}", "model": decoder.model.name, "decoding": f"beam {beam}" if beam > 1 else "greedy",
            "terms": len(entries),
            "tokens_per_s_without": max(plain_rates),
            "tokens_per_s_with": max(glossary_rates),
            # Each round decodes without and with back to back: the median of the rounds' ratios, which
            # this machine's drift between rounds (10-20% in tokens/s) moves far less than a ratio of bests.
            "ratio": statistics.median(g / p for g, p in zip(glossary_rates, plain_rates)),
            "untouched_identical": f"{sum(ids[i] == plain_ids[i] for i in untouched)}/{len(untouched)}",
            "coverage": sum(appears(t, out) for t, out in found) / max(len(found), 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="val", help="val (selection) or test_2016_flickr (the report)")
    parser.add_argument("--pairs", default="de,fr")
    parser.add_argument("--modes", default="greedy,beam5")
    parser.add_argument("--configs", default="none,placeholder,force,bonus1,bonus3,bonus3+eos,chosen")
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (a quick check)")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository",
                        help="the model repository whose model for each pair is measured (an imported Marian's, "
                        "say: docs/glossaries.md)")
    parser.add_argument("--throughput", action="store_true", help="tokens/s with a 50-term glossary vs none "
                        "(one thread; run it on a quiet machine)")
    parser.add_argument("--beams", default="1,4", help="with --throughput: beam widths to measure (1 = greedy)")
    parser.add_argument("--rounds", type=int, default=5, help="with --throughput: rounds, each without a glossary "
                        "then with it; the ratio is the median of the rounds'")
    args = parser.parse_args(argv)
    if args.throughput:
        for pair in args.pairs.split(","):
            for beam in map(int, args.beams.split(",")):
                print(throughput(pair, args.split, args.rounds, beam, args.repository), flush=True)
        return 0
    rows = []
    for pair in args.pairs.split(","):
        rows += evaluate(pair, args.split, args.modes.split(","), args.configs.split(","), args.limit,
                         args.repository)
    print("| model | pair | decoding | configuration | terms | coverage | BLEU | sentences without terms identical |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['pair']} | {r['mode']} | {r['config']} | {r['terms']} | {100 * r['coverage']:.1f}% | "
              f"{r['bleu']:.2f} | {r['untouched_identical']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
