"""Real Hugging Face checkpoint directories, built here (no network): Marian and M2M100, scaled down.

Each gets a SentencePiece model trained on this repo's test captions, a vocab.json
in the real models' id layout, the transformers tokenizer class's own files
(save_pretrained), and weights trained for a few hundred steps on a word-order
task, so greedy and beam outputs depend on positions (random weights decode to
one repeated token and would hide a wrong position table). final_logits_bias
gets non-zero values.

The task: the target is the source's words in reverse order, each spelled
backwards (a second target language, for M2M100, keeps the order).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch

CAPTIONS = Path(__file__).parent / "data" / "test_2016_flickr.head200.en"


def _words() -> list[str]:
    words = sorted({w.strip(".,;!?\"'").lower() for line in CAPTIONS.read_text().splitlines() for w in line.split()})
    return [w for w in words if w.isalpha()][:120]


def _pairs(n: int, rng: random.Random, target: str = "reverse") -> list[tuple[str, str]]:
    words = _words()
    out = []
    for _ in range(n):
        src = [rng.choice(words) for _ in range(rng.randint(2, 7))]
        tgt = [w[::-1] for w in (reversed(src) if target == "reverse" else src)]
        out.append((" ".join(src).capitalize() + ".", " ".join(tgt) + "."))
    return out


def train_spm(prefix: Path, texts: list[str], vocab_size: int) -> Path:
    import sentencepiece as spm
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=str(prefix), vocab_size=vocab_size,
                                   character_coverage=1.0, model_type="unigram", minloglevel=2,
                                   bos_id=-1, eos_id=-1, unk_id=0, num_threads=1)
    return prefix.with_suffix(".model")


def _pieces(model: Path) -> list[str]:
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_unknown(i)]


def _train(model, batches, steps: int, seed: int) -> None:
    # One thread: a model this small gains nothing from two, and a second spinning thread on a
    # busy 2-core machine made each step ~60x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        enc, dec_in, labels = batches[step % len(batches)]
        loss = model(input_ids=enc, attention_mask=(enc != model.config.pad_token_id).long(),
                     decoder_input_ids=dec_in, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    torch.set_num_threads(threads)


def _pad(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


def _batches(examples: list[tuple[list[int], list[int]]], start: int, pad: int, size: int = 32):
    out = []
    for i in range(0, len(examples), size):
        chunk = examples[i:i + size]
        enc = _pad([s for s, _ in chunk], pad)
        dec_in = _pad([[start] + t[:-1] for _, t in chunk], pad)
        labels = _pad([t for _, t in chunk], -100)
        out.append((enc, dec_in, labels))
    return out


def _marian_vocab(pieces: list[str], pad_last: bool, codes: tuple[str, ...] = ()) -> dict[str, int]:
    """OPUS-MT's layout: </s> 0, <unk> 1, pieces, >>codes<<, <pad> last; or <pad> at 2 (separate vocabularies
    must keep the special tokens at the same ids on both sides)."""
    vocab = {"</s>": 0, "<unk>": 1} if pad_last else {"</s>": 0, "<unk>": 1, "<pad>": 2}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    for code in codes:
        vocab[f">>{code}<<"] = len(vocab)
    vocab.setdefault("<pad>", len(vocab))
    return vocab


def build_marian(out: Path, steps: int = 300, d_model: int = 64, separate_vocabs: bool = False) -> Path:
    """An OPUS-MT-shaped MarianMT checkpoint (post-norm, swish, scaled embeddings, pad = decoder start);
    multi-target (>>xx<< / >>yy<<) with a joint vocabulary, or one target with separate vocabularies."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    rng = random.Random(0)
    pairs = _pairs(1500, rng)
    work = out / "_spm"
    work.mkdir(parents=True, exist_ok=True)
    captions = CAPTIONS.read_text().splitlines()
    if separate_vocabs:
        src_spm = train_spm(work / "source", [s for s, _ in pairs] + captions, 300)
        tgt_spm = train_spm(work / "target", [t for _, t in pairs], 140)
        vocab, target_vocab = _marian_vocab(_pieces(src_spm), False), _marian_vocab(_pieces(tgt_spm), False)
        (work / "target_vocab.json").write_text(json.dumps(target_vocab, ensure_ascii=False))
        codes, prefix = (), ""
    else:
        src_spm = tgt_spm = train_spm(work / "joint", [s for p in pairs for s in p] + captions, 400)
        # Multi-target, like opus-mt-en-ROMANCE: the source text starts with the target's >>code<<.
        vocab, target_vocab, codes, prefix = None, None, ("xx", "yy"), ">>xx<< "
        vocab = _marian_vocab(_pieces(src_spm), True, codes)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok = MarianTokenizer(source_spm=str(src_spm), target_spm=str(tgt_spm), vocab=str(work / "vocab.json"),
                          target_vocab_file=str(work / "target_vocab.json") if separate_vocabs else None,
                          separate_vocabs=separate_vocabs, source_lang="en", target_lang="xx")
    pad = vocab["<pad>"]
    cfg = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(target_vocab or vocab), d_model=d_model,
                       encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                       encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=pad,
                       decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                       activation_function="swish", scale_embedding=True,
                       share_encoder_decoder_embeddings=not separate_vocabs, tie_word_embeddings=True, dropout=0.0)
    torch.manual_seed(0)
    model = MarianMTModel(cfg)
    examples = [(tok(prefix + s)["input_ids"], tok(text_target=t)["input_ids"]) for s, t in pairs]
    _train(model, _batches(examples, pad, pad), steps, seed=0)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias) * 0.3)
    # As OPUS-MT's generation_config.json: pad never generated, renormalised after that.
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.renormalize_logits = True
    model.generation_config.num_beams = 4
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _train_m2m100(out: Path, tok, vocab_size: int, targets: dict, d_model: int, steps: int, seed: int) -> Path:
    """An M2M100 model (pre-norm, final norms, ReLU, fairseq positions) trained on `targets` (language ->
    pairs) through `tok`, saved with it; the first target language is the tokenizer's default."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    cfg = M2M100Config(vocab_size=vocab_size, d_model=d_model, encoder_layers=2, decoder_layers=2,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                       decoder_ffn_dim=128, max_position_embeddings=128, dropout=0.0, attention_dropout=0.0,
                       encoder_layerdrop=0.0, decoder_layerdrop=0.0, scale_embedding=True)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(cfg)
    examples = []
    for lang, pairs in targets.items():
        tok.tgt_lang = lang
        examples += [(tok(s)["input_ids"], tok(text_target=t)["input_ids"]) for s, t in pairs]
    random.Random(seed + 1).shuffle(examples)
    _train(model, _batches(examples, cfg.decoder_start_token_id, cfg.pad_token_id), steps, seed=seed)
    tok.tgt_lang = next(iter(targets))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


M2M_LANGS = ("en", "de", "fr")


def build_m2m100(out: Path, steps: int = 300, d_model: int = 64) -> Path:
    """An M2M100-shaped checkpoint (pre-norm, final norms, ReLU, fairseq positions, language tokens)."""
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    rng = random.Random(1)
    de, fr = _pairs(1000, rng, "reverse"), _pairs(1000, rng, "keep")
    work = out / "_spm"
    work.mkdir(parents=True, exist_ok=True)
    spm_model = train_spm(work / "m2m", [s for p in de + fr for s in p] + CAPTIONS.read_text().splitlines(), 400)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for p in _pieces(spm_model):
        vocab.setdefault(p, len(vocab))
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    codes = FAIRSEQ_LANGUAGE_CODES["m2m100"]
    tok = M2M100Tokenizer(vocab_file=str(work / "vocab.json"), spm_file=str(spm_model), src_lang="en", tgt_lang="de",
                          additional_special_tokens=[f"__{c}__" for c in codes])
    return _train_m2m100(out, tok, len(vocab) + len(codes) + 8, {"de": de, "fr": fr}, d_model, steps, seed=1)


NLLB_LANGS = ("eng_Latn", "deu_Latn", "fra_Latn")


def build_nllb(out: Path, steps: int = 300, d_model: int = 64) -> Path:
    """An NLLB-shaped checkpoint: the M2M100 architecture with NLLB's tokenizer (a tokenizer.json BPE,
    <s> 0 <pad> 1 </s> 2 <unk> 3, language codes such as deu_Latn as special tokens after the vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import NllbTokenizer

    rng = random.Random(3)
    de, fr = _pairs(1000, rng, "reverse"), _pairs(1000, rng, "keep")
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    bpe.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    bpe.train_from_iterator([s for p in de + fr for s in p] + CAPTIONS.read_text().splitlines(),
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                show_progress=False))
    spec = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = NllbTokenizer(vocab=spec["vocab"], merges=merges, extra_special_tokens=list(NLLB_LANGS),
                        src_lang="eng_Latn", tgt_lang="deu_Latn")
    return _train_m2m100(out, tok, len(tok) + 1, {"deu_Latn": de, "fra_Latn": fr}, d_model, steps, seed=3)


def test_sentences(n: int, seed: int = 5) -> list[str]:
    """Held-out inputs of the trained task (plus a few awkward ones)."""
    return [s for s, _ in _pairs(n, random.Random(seed))]
