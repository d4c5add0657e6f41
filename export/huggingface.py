"""Import a Hugging Face MarianMT (OPUS-MT) or M2M100 checkpoint into this repo's model and bundle.

    python -m export --from-huggingface ./opus-mt-en-de --out model_repository

The model math stays ours (models/transformer.py): the checkpoint's config is
mapped onto ModelConfig's flags (norm placement, activation, embedding scale,
position table, final norms, logits bias, special ids), its weights onto our
parameter names, and its tokenizer files are carried into the bundle for
models/core/sentencepiece_tokenizer.py. CTranslate2's converters are the model for
the checks: every unsupported flag, unmapped weight or inconsistent vocabulary
is collected and reported at once, and the caller writes nothing if any
exists. Parity against transformers itself (logits, tokenizer ids) runs here
too, since transformers is only installed where export runs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from models.core.config import ModelConfig
from models.transformer import Transformer, sinusoidal_table

SUPPORTED = {"marian": "MarianMTModel", "m2m_100": "M2M100ForConditionalGeneration"}
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
HUB_FILES = ["config.json", "generation_config.json", "*.safetensors", "pytorch_model.bin", "*.spm", "*.json",
             "sentencepiece.bpe.model"]


class ImportProblems(ValueError):
    """Everything wrong with a checkpoint, one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class Imported:
    model: Transformer
    meta: dict[str, Any]  # src_lang / tgt_lang (defaults), source (where it came from)
    tokenizer_files: dict[str, Path]  # bundle file name -> file to copy
    tokenizer_entry: dict[str, Any]  # the bundle's config.json `tokenizer` section
    languages: dict[str, Any]  # the bundle's `languages` section
    generation: dict[str, Any]  # the bundle's `generation` section
    hf_dir: Path
    reference: Any = field(default=None, repr=False)  # the transformers model, for parity


def resolve(source: str) -> Path:
    """A local directory as is; otherwise a hub id, downloaded through huggingface_hub."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or source.startswith((".", "/")) or source.count("/") != 1:
        raise ImportProblems([f"{source}: not a directory with a Hugging Face checkpoint, nor a hub id like "
                              "Helsinki-NLP/opus-mt-en-de"])
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(source, allow_patterns=HUB_FILES))
    except Exception as e:  # noqa: BLE001 (offline, unknown repo, no access: one line either way)
        raise ImportProblems([f"could not download {source} from the Hugging Face hub ({type(e).__name__}); "
                              "on a machine without network access, download it elsewhere and pass the local "
                              "directory"]) from None


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def map_config(hf: dict[str, Any], problems: list[str], unk_id: Optional[int] = None) -> Optional[ModelConfig]:
    """Hugging Face config.json -> ModelConfig; an unsupported flag is a problem, never approximated."""
    kind = hf.get("model_type")
    if kind not in SUPPORTED:
        problems.append(f"unsupported architecture model_type={kind!r} (supported: {', '.join(SUPPORTED)})")
        return None
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim")):
        if hf.get(a) != hf.get(b):
            problems.append(f"{a}={hf.get(a)} differs from {b}={hf.get(b)}: the model keeps one value for both")
    act = hf.get("activation_function", "gelu" if kind == "marian" else "relu")
    if act not in ACTIVATIONS:
        problems.append(f"activation_function={act!r} is not supported ({', '.join(ACTIVATIONS)})")
    if kind == "marian":
        # transformers runs every Marian checkpoint post-norm without final norms, whatever these say.
        for flag in ("add_final_layer_norm", "normalize_embedding", "add_bias_logits"):
            if hf.get(flag):
                problems.append(f"{flag}=true is not supported (transformers' Marian ignores it too)")
    vocab, tgt_vocab = hf.get("vocab_size"), hf.get("decoder_vocab_size")
    shared = kind != "marian" or hf.get("share_encoder_decoder_embeddings", True)
    if not shared and not hf.get("tie_word_embeddings", True):
        problems.append("tie_word_embeddings=false with separate vocabularies is not supported")
    if problems:
        return None
    pad, eos = hf["pad_token_id"], hf["eos_token_id"]
    start = hf.get("decoder_start_token_id", pad if kind == "marian" else eos)
    unk = unk_id if unk_id is not None else (1 if kind == "marian" else 3)  # OPUS-MT's and fairseq's <unk>
    try:
        return ModelConfig(
            vocab_size=vocab, d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"],
            n_enc_layers=hf["encoder_layers"], n_dec_layers=hf["decoder_layers"], d_ff=hf["encoder_ffn_dim"],
            dropout=0.0, attn_dropout=0.0, max_positions=hf["max_position_embeddings"],
            pre_norm=kind == "m2m_100", final_norms=kind == "m2m_100", activation=ACTIVATIONS[act],
            tie_embeddings=shared, tie_output=hf.get("tie_word_embeddings", True),
            tgt_vocab_size=None if shared or tgt_vocab in (None, vocab) else tgt_vocab,
            scale_embeddings=bool(hf.get("scale_embedding", kind == "m2m_100")),
            position_freq_shift=1 if kind == "m2m_100" else 0, position_offset=2 if kind == "m2m_100" else 0,
            output_bias=kind == "marian", pad_id=pad, bos_id=start, eos_id=eos, unk_id=unk)
    except ValueError as e:
        problems.append(str(e))
        return None


def _layer_map(prefix: str, ours: str, cross: bool) -> dict[str, str]:
    names = {"self_attn": "self_attn", "self_attn_layer_norm": "norm1", "fc1": "ffn.fc1", "fc2": "ffn.fc2"}
    names.update({"encoder_attn": "cross_attn", "encoder_attn_layer_norm": "norm2", "final_layer_norm": "norm3"}
                 if cross else {"final_layer_norm": "norm2"})
    out = {}
    for theirs, mine in names.items():
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj") if "attn" in theirs and "norm" not in theirs else ("",):
            for p in ("weight", "bias"):
                t = ".".join(x for x in (prefix, theirs, proj, p) if x)
                out[t] = ".".join(x for x in (ours, mine, proj, p) if x)
    return out


def map_weights(hf_state: dict[str, torch.Tensor], cfg: ModelConfig, problems: list[str]) -> dict[str, torch.Tensor]:
    """Hugging Face state dict -> ours; weights left over or missing are problems."""
    names: dict[str, str] = {"model.shared.weight": "embed.weight", "model.encoder.embed_tokens.weight": "embed.weight"}
    if not cfg.tie_embeddings:
        names["model.decoder.embed_tokens.weight"] = "tgt_embed.weight"
    if not cfg.tie_output:
        names["lm_head.weight"] = "out_proj.weight"
    if cfg.output_bias:
        names["final_logits_bias"] = "final_logits_bias"
    if cfg.final_norms:
        for side, ours in (("encoder", "enc_norm"), ("decoder", "dec_norm")):
            names[f"model.{side}.layer_norm.weight"] = f"{ours}.weight"
            names[f"model.{side}.layer_norm.bias"] = f"{ours}.bias"
    for i in range(cfg.n_enc_layers):
        names.update(_layer_map(f"model.encoder.layers.{i}", f"encoder.{i}", cross=False))
    for i in range(cfg.n_dec_layers):
        names.update(_layer_map(f"model.decoder.layers.{i}", f"decoder.{i}", cross=True))
    # Tied copies and position tables are checked, not loaded.
    derived = {"model.decoder.embed_tokens.weight", "lm_head.weight", "model.encoder.embed_positions.weight",
               "model.decoder.embed_positions.weight"}
    out: dict[str, torch.Tensor] = {}
    for key, value in hf_state.items():
        if key in names:
            out[names[key]] = value.detach().to(torch.float32).reshape(-1) if key == "final_logits_bias" \
                else value.detach().to(torch.float32)
        elif key not in derived:
            problems.append(f"weight {key} {tuple(value.shape)} has no place in the model (unsupported feature)")
    for key in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if key in hf_state:  # Marian stores its sinusoid table: it must be the one we compute
            table = hf_state[key].to(torch.float32)
            ours = sinusoidal_table(torch.arange(table.shape[0]) + cfg.position_offset, cfg.d_model,
                                    cfg.position_freq_shift)
            diff = float((table - ours).abs().max())
            if diff > 1e-4:
                problems.append(f"{key} is not the sinusoid table this model computes (max |diff| {diff:.2e})")
    for want in sorted(set(names.values()) - set(out)):
        if want != "embed.weight" or "embed.weight" not in out:
            problems.append(f"checkpoint lacks the weights for {want}")
    return out


def _languages_marian(hf_dir: Path, vocab: dict[str, int], src: str, tgt: str) -> tuple[dict, list[str]]:
    codes = {p[2:-2]: i for p, i in vocab.items() if p.startswith(">>") and p.endswith("<<")}
    if codes:  # multi-target: the target's >>code<< leads the source text
        return {"pairs": [[src, c] for c in sorted(codes)], "source_tokens": {}, "target_tokens": codes,
                "target_rule": "source_prefix"}, []
    return {"pairs": [[src, tgt]], "target_rule": "none"}, []


def tokenizer(hf_dir: Path, kind: str, cfg: ModelConfig, src: Optional[str], tgt: Optional[str],
              problems: list[str]) -> tuple[dict[str, Path], dict, dict, tuple[str, str]]:
    """The tokenizer files to carry, the bundle's tokenizer and languages sections, the default pair."""
    from models.core.sentencepiece_tokenizer import SentencePieceTokenizer

    tcfg = _read_json(hf_dir / "tokenizer_config.json")
    src = src or tcfg.get("source_lang") or tcfg.get("src_lang")
    tgt = tgt or tcfg.get("target_lang") or tcfg.get("tgt_lang")
    if not src or not tgt:
        problems.append("the checkpoint does not name its languages: pass --src-lang and --tgt-lang")
    need = ["vocab.json"] + (["source.spm", "target.spm"] if kind == "marian" else ["sentencepiece.bpe.model"])
    if tcfg.get("separate_vocabs"):
        need.append("target_vocab.json")
    missing = [n for n in need if not (hf_dir / n).exists()]
    if tcfg.get("tokenizer_class", "").startswith("Nllb"):
        return _nllb_tokenizer(hf_dir, tcfg, cfg, src, tgt, problems)
    if missing:
        problems.append(f"tokenizer files missing: {', '.join(missing)}")
        return {}, {}, {}, (src, tgt)
    vocab = _read_json(hf_dir / "vocab.json")
    target_vocab = _read_json(hf_dir / "target_vocab.json") if tcfg.get("separate_vocabs") else vocab
    ids = {name: vocab.get(tok) for name, tok in (("eos", "</s>"), ("pad", "<pad>"), ("unk", "<unk>"))}
    for name, want in (("eos", cfg.eos_id), ("pad", cfg.pad_id), ("unk", cfg.unk_id)):
        if ids[name] != want:
            problems.append(f"vocab.json gives {name} id {ids[name]}, the model config {want}")
    files = {n: hf_dir / n for n in need}
    if kind == "marian":
        if len(vocab) != cfg.vocab_size or len(target_vocab) != cfg.out_vocab_size:
            problems.append(f"vocabulary sizes {len(vocab)}/{len(target_vocab)} (vocab.json/target) do not match "
                            f"the model's {cfg.vocab_size}/{cfg.out_vocab_size}")
        entry = SentencePieceTokenizer.entry("source.spm", "vocab.json", target_model="target.spm",
                                             target_vocab="target_vocab.json" if tcfg.get("separate_vocabs") else None,
                                             eos_id=cfg.eos_id, pad_id=cfg.pad_id, unk_id=cfg.unk_id,
                                             split_language_code=True)
        languages, _ = _languages_marian(hf_dir, vocab, src, tgt)
        return files, entry, languages, (src, tgt)
    # M2M100: language tokens __xx__ follow vocab.json's ids, in fairseq's fixed order.
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES
    codes_name = tcfg.get("language_codes", "m2m100")
    if codes_name not in FAIRSEQ_LANGUAGE_CODES:
        problems.append(f"language_codes={codes_name!r} unknown (known: {', '.join(FAIRSEQ_LANGUAGE_CODES)})")
        return {}, {}, {}, (src, tgt)
    codes = FAIRSEQ_LANGUAGE_CODES[codes_name]
    lang_ids = {c: len(vocab) + i for i, c in enumerate(codes)}
    if max(lang_ids.values()) >= cfg.vocab_size:
        problems.append(f"{len(vocab)} vocabulary pieces + {len(codes)} language tokens do not fit the model's "
                        f"vocab_size {cfg.vocab_size}")
    for code in (src, tgt):
        if code and code not in lang_ids:
            problems.append(f"language {code!r} is not among the model's {len(codes)} language codes")
    entry = SentencePieceTokenizer.entry("sentencepiece.bpe.model", "vocab.json", eos_id=cfg.eos_id,
                                         pad_id=cfg.pad_id, unk_id=cfg.unk_id, skip_ids=sorted(lang_ids.values()))
    entry["bos_id"] = vocab.get("<s>")
    languages = {"pairs": [[s, t] for s in codes for t in codes if s != t], "source_tokens": lang_ids,
                 "target_tokens": lang_ids, "target_rule": "forced_bos"}
    return files, entry, languages, (src, tgt)


def _nllb_tokenizer(hf_dir: Path, tcfg: dict, cfg: ModelConfig, src: Optional[str], tgt: Optional[str],
                    problems: list[str]) -> tuple[dict[str, Path], dict, dict, tuple[str, str]]:
    """NLLB-200: its tokenizer.json as is; language codes (eng_Latn, ...) are special tokens of that file."""
    from tokenizers import Tokenizer

    from models.core.tokenizer_json import JsonTokenizer
    if not (hf_dir / "tokenizer.json").exists():
        problems.append("tokenizer files missing: tokenizer.json (NLLB's tokenizer is that file)")
        return {}, {}, {}, (src, tgt)
    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    codes = tcfg.get("extra_special_tokens") or tcfg.get("additional_special_tokens")
    if not codes:
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES as codes
    codes = [c if isinstance(c, str) else c.get("content") for c in codes]
    lang_ids = {c: tok.token_to_id(c) for c in codes}
    unknown = sorted(c for c, i in lang_ids.items() if i is None)
    if unknown:
        problems.append(f"language codes missing from tokenizer.json: {', '.join(unknown[:10])}")
    for name, piece, want in (("eos", "</s>", cfg.eos_id), ("pad", "<pad>", cfg.pad_id), ("unk", "<unk>", cfg.unk_id)):
        if tok.token_to_id(piece) != want:
            problems.append(f"tokenizer.json gives {name} id {tok.token_to_id(piece)}, the model config {want}")
    if tok.get_vocab_size() > cfg.vocab_size:
        problems.append(f"tokenizer.json has {tok.get_vocab_size()} tokens, more than the model's {cfg.vocab_size}")
    for code in (src, tgt):
        if code and code not in lang_ids:
            problems.append(f"language {code!r} is not among the model's {len(lang_ids)} language codes")
    lang_ids = {c: i for c, i in lang_ids.items() if i is not None}
    entry = JsonTokenizer.entry("tokenizer.json", eos_id=cfg.eos_id, pad_id=cfg.pad_id, unk_id=cfg.unk_id,
                                skip_ids=sorted(lang_ids.values()))
    languages = {"pairs": [[s, t] for s in lang_ids for t in lang_ids if s != t], "source_tokens": lang_ids,
                 "target_tokens": lang_ids, "target_rule": "forced_bos"}
    return {"tokenizer.json": hf_dir / "tokenizer.json"}, entry, languages, (src, tgt)


def generation_rules(hf_dir: Path, cfg: ModelConfig, problems: list[str]) -> tuple[tuple[int, ...], dict]:
    """generation_config.json -> (suppressed ids, the bundle's generation section)."""
    gen = _read_json(hf_dir / "generation_config.json") or _read_json(hf_dir / "config.json")
    suppress = set(gen.get("suppress_tokens") or [])
    for seq in gen.get("bad_words_ids") or []:
        if len(seq) == 1:
            suppress.add(seq[0])
        else:
            problems.append(f"bad_words_ids entry {seq} has several tokens; only single tokens are supported")
    forced_eos = gen.get("forced_eos_token_id")
    if forced_eos not in (None, cfg.eos_id):
        problems.append(f"forced_eos_token_id={forced_eos} is not the EOS id {cfg.eos_id}")
    early = gen.get("early_stopping", False)  # transformers' default
    if early not in (True, False):
        problems.append(f"early_stopping={early!r} is not supported (true or false)")
    section = {"force_eos_at_limit": forced_eos is not None, "renormalize": bool(gen.get("renormalize_logits")),
               "early_stopping": early is True,
               "defaults": {k: gen[k] for k in ("num_beams", "length_penalty", "max_length", "early_stopping")
                            if k in gen}}
    return tuple(sorted(suppress)), section


def import_checkpoint(source: str, src_lang: Optional[str] = None, tgt_lang: Optional[str] = None) -> Imported:
    """Load, map and check a Hugging Face checkpoint; raises ImportProblems listing everything wrong."""
    hf_dir = resolve(source)
    problems: list[str] = []
    hf_cfg = _read_json(hf_dir / "config.json")
    if not hf_cfg:
        raise ImportProblems([f"{hf_dir}: no config.json"])
    if not any((hf_dir / n).exists() for n in ("model.safetensors", "pytorch_model.bin")):
        problems.append("no weights (model.safetensors or pytorch_model.bin)")
    cfg = map_config(hf_cfg, problems, _read_json(hf_dir / "vocab.json").get("<unk>"))
    if cfg is None:
        raise ImportProblems(problems)
    suppress, generation = generation_rules(hf_dir, cfg, problems)
    cfg = ModelConfig.from_dict({**cfg.to_dict(), "suppress_ids": list(suppress)})
    files, entry, languages, (src, tgt) = tokenizer(hf_dir, hf_cfg["model_type"], cfg, src_lang, tgt_lang, problems)
    if problems:  # before loading weights: a refused checkpoint costs nothing
        raise ImportProblems(problems)
    hf_model = load_reference(hf_dir)
    ours = Transformer(cfg).eval()
    state = map_weights(hf_model.state_dict(), cfg, problems)
    if problems:
        raise ImportProblems(problems)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    allowed = {"tgt_embed.weight"} if cfg.tie_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise ImportProblems([f"weights not loaded: missing {sorted(set(missing) - allowed)}, "
                              f"unexpected {sorted(unexpected)}"])
    meta = {"src_lang": src, "tgt_lang": tgt, "source": source, "model_type": hf_cfg["model_type"]}
    return Imported(ours, meta, files, entry, languages, generation, hf_dir, hf_model)


def load_reference(hf_dir: Path):
    """The checkpoint as transformers runs it (fp32, eval): the weights' source and the parity reference."""
    from transformers import AutoModelForSeq2SeqLM
    return AutoModelForSeq2SeqLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


PARITY_SENTENCES = [
    "A man in a blue shirt is standing on a ladder cleaning windows.",
    "Two dogs play in the snow.",
    "The quick brown fox jumps over the lazy dog, doesn't it?",
    "Children   are sitting\tat a table; one of them is eating 3.5 apples!",
    "Ünïcödé, emoji \U0001F600 and 漢字 are rare here.",
    "Hi.",
]


@torch.no_grad()
def reference_parity(imported: Imported, hf_model, tok, sentences: list[str] = PARITY_SENTENCES,
                     steps: int = 6) -> tuple[float, list[str]]:
    """Our model vs transformers on one ragged, right-padded batch: (max |logit diff|, tokenizer problems).

    The decoder input is the start token and `steps` fixed tokens for every row, so the
    comparison covers the decoder's positions as well as the encoder's padding mask.
    """
    from transformers import AutoTokenizer

    cfg = imported.model.cfg
    problems = []
    lang = imported.languages
    prefix = [lang["source_tokens"][imported.meta["src_lang"]]] if lang.get("target_rule") == "forced_bos" else []
    ours = [prefix + tok.encode(s) for s in sentences]
    kwargs = {"src_lang": imported.meta["src_lang"]} if lang.get("target_rule") == "forced_bos" else {}
    ref_tok = AutoTokenizer.from_pretrained(str(imported.hf_dir), **kwargs)
    theirs = [ref_tok(s)["input_ids"] for s in sentences]
    for s, a, b in zip(sentences, ours, theirs):
        if a != b:
            problems.append(f"tokenizer ids differ from transformers' on {s!r}: {a} vs {b}")
    width = max(map(len, ours))
    src = torch.full((len(ours), width), cfg.pad_id, dtype=torch.long)
    for i, ids in enumerate(ours):
        src[i, :len(ids)] = torch.tensor(ids)
    mask = src != cfg.pad_id
    g = torch.Generator().manual_seed(0)
    body = torch.randint(0, cfg.out_vocab_size, (len(ours), steps), generator=g)
    body[body == cfg.pad_id] = cfg.eos_id  # M2M100 positions skip pad tokens; keep the decoder input pad-free
    tgt = torch.cat([torch.full((len(ours), 1), cfg.bos_id), body], dim=1)
    ref = hf_model(input_ids=src, attention_mask=mask.long(), decoder_input_ids=tgt).logits
    got = imported.model(src, tgt)
    return float((ref - got).abs().max()), problems
