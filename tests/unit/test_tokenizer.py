"""Tokenizer: special ids, normalisation, round trip, save/load."""
import pytest

from models.core.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from models.core.tokenizer import SubwordTokenizer, normalize, train_tokenizer

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`

CORPUS = [
    "A man is riding a bike.",
    "Ein Mann fährt Fahrrad.",
    "Two dogs are playing in the snow.",
    "Zwei Hunde spielen im Schnee.",
    "A little girl climbs into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Le chat dort sur le canapé ; il est très mignon !",
] * 20


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    t = train_tokenizer(CORPUS, vocab_size=300, min_frequency=1)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(path)
    return SubwordTokenizer.load(path)  # every test goes through the saved file


def test_special_ids_are_fixed(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert [tok.piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]


@pytest.mark.parametrize("text", CORPUS[:7] + ["Mädchen spielen.", "bike dogs snow"])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert ids[-1] == EOS_ID and EOS_ID not in ids[:-1]
    assert tok.decode(ids) == text


def test_whitespace_is_normalised_like_the_data_loader(tok):
    raw = "  Ein\u00a0Mann\tfährt \u202f Fahrrad.\u200b "
    assert tok.normalize(raw) == normalize(raw) == "Ein Mann fährt Fahrrad."
    assert tok.decode(tok.encode(raw)) == "Ein Mann fährt Fahrrad."


def test_unknown_characters_map_to_unk_and_survive_decoding(tok):
    ids = tok.encode("Ein Mann 漢", add_eos=False)
    assert UNK_ID in ids
    assert "<unk>" in tok.decode(ids)


def test_nfc_normalisation():
    decomposed = "Ma\u0308dchen"  # a + combining diaeresis
    assert normalize(decomposed) == "Mädchen"


def test_batch_encode_matches_single(tok):
    texts = CORPUS[:5]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_bpe_dropout_samples_smaller_pieces_of_the_same_text_and_is_switched_off_after(tok):
    text = "A man is playing a guitar on the street."
    plain = tok.encode(text)
    chars = tok.encode_batch_sampled([text], dropout=1.0)[0]  # every merge skipped: single characters
    assert tok.decode(chars) == tok.decode(plain) and len(chars) > len(plain)
    assert all(len(tok.piece(i).lstrip("▁")) <= 1 for i in chars[:-1])
    assert tok.encode(text) == plain and tok.tok.model.dropout is None  # deterministic again, nothing saved
