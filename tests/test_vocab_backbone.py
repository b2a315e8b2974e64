"""Project vocab, the Rust tokenizer's parity with paddlenlp's, and backbone resolution (no silent fallback)."""
import logging

import numpy as np
import pytest

from mrc.backbone import has_weights, load_encoder, resolve_backbone
from mrc.data import load_sources
from mrc.errors import MRCError
from mrc.vocab import build_vocab, fast_tokenizer, load_tokenizer

TEXTS = ["北京大学位于北京市海淀区。", "The iPhone 12 costs 5999元，约合US$900。", "水深约4～5m，气温-3℃。", "𠀀字和😀表情"]


@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
    return build_vocab(TEXTS * 3, tmp_path_factory.mktemp("vocab"))


def test_vocab_has_specials_first_and_every_cjk_character(tiny_vocab):
    tokens = (tiny_vocab / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for ch in "".join(TEXTS):
        if "\u4e00" <= ch <= "\u9fff":
            assert ch in tokens
    assert len(tokens) == len(set(tokens))
    tok = load_tokenizer(tiny_vocab)
    assert tok.unk_token_id not in tok("北京大学位于海淀区")["input_ids"]


def test_fast_tokenizer_matches_paddlenlp_ids_and_offsets(tiny_vocab):
    tok = load_tokenizer(tiny_vocab)
    fast = fast_tokenizer(tok)
    for text in TEXTS:
        enc = fast.encode(text)
        assert enc.ids == tok(text)["input_ids"]
        for token, (start, end) in zip(enc.tokens, enc.offsets):
            if token not in ("[CLS]", "[SEP]", "[UNK]"):
                assert text[start:end].lower() == token.removeprefix("##")


def test_fast_tokenizer_matches_paddlenlp_on_real_questions_and_passages(data_dir, tmp_path):
    df = load_sources(["checklist_dev", "drcd_dev", "cail_dev", "squad2_zh"], data_dir=data_dir).sample(400, random_state=0)
    vocab = build_vocab(list(df["context"]) + list(df["question"]), tmp_path / "vocab")
    tok = load_tokenizer(vocab)
    fast = fast_tokenizer(tok)
    same = sum(fast.encode(q, c).ids == tok(q, c)["input_ids"] for q, c in zip(df["question"], df["context"]))
    assert same == len(df)


def test_backbone_resolution_logs_random_init_offline(tmp_path, caplog):
    spec = resolve_backbone("ernie", profile="tiny", outputs_dir=tmp_path)
    assert spec.kind == "random" and spec.arch == "ernie" and "no pre-trained checkpoint" in spec.reason
    build_vocab(TEXTS, tmp_path / "vocab")
    with caplog.at_level(logging.INFO, logger="mrc.backbone"):
        model, tok = load_encoder(spec)
    assert type(model).__name__ == "ErnieModel" and model.config.hidden_size == 64
    assert "backbone ernie: random" in caplog.text


def test_backbone_prefers_own_pretraining_then_dir(tmp_path):
    build_vocab(TEXTS, tmp_path / "vocab")
    model, tok = load_encoder(resolve_backbone("bert", profile="tiny", outputs_dir=tmp_path))
    own = tmp_path / "pretrain" / "bert"
    model.save_pretrained(str(own))
    tok.save_pretrained(str(own))
    assert has_weights(own)
    spec = resolve_backbone("bert", profile="tiny", outputs_dir=tmp_path)
    assert (spec.kind, spec.source) == ("pretrained", str(own))
    spec = resolve_backbone(str(own), profile="tiny", outputs_dir=tmp_path)
    assert spec.kind == "local" and spec.arch == "bert"
    loaded, _ = load_encoder(spec)
    assert (loaded.embeddings.word_embeddings.weight.numpy() == model.embeddings.word_embeddings.weight.numpy()).all()



def test_dropout_override_for_random_init_and_checkpoints(tmp_path):
    """--dropout sets the encoder's hidden and attention dropout (here 0: the layers become identities, so two
    forward passes in training mode agree); without it the config's own 0.1 stays. A checkpoint keeps its weights."""
    import paddle

    build_vocab(TEXTS, tmp_path / "vocab")
    spec = resolve_backbone("bert", profile="tiny", outputs_dir=tmp_path)
    default, tok = load_encoder(spec)
    assert default.config.hidden_dropout_prob == 0.1
    ids = paddle.to_tensor([tok("北京大学", "在上海")["input_ids"]])
    default.train()
    assert not np.allclose(default(ids)[0].numpy(), default(ids)[0].numpy())
    own = tmp_path / "pretrain" / "bert"
    default.save_pretrained(str(own))
    tok.save_pretrained(str(own))
    for spec in (resolve_backbone("bert", profile="tiny", outputs_dir=tmp_path / "elsewhere"),
                 resolve_backbone(str(own), profile="tiny", outputs_dir=tmp_path)):
        if spec.kind == "random":
            build_vocab(TEXTS, tmp_path / "elsewhere" / "vocab")
        model, _ = load_encoder(spec, dropout=0.0)
        assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0
        model.train()
        assert np.allclose(model(ids)[0].numpy(), model(ids)[0].numpy())
    assert np.allclose(model.embeddings.word_embeddings.weight.numpy(), default.embeddings.word_embeddings.weight.numpy())


@pytest.mark.parametrize("name,fragment", [
    ("no-such-model", "unknown model 'no-such-model'"),
    ("./missing_dir", "checkpoint directory not found"),
])
def test_unknown_model_and_missing_checkpoint_are_one_line_errors(name, fragment, tmp_path):
    with pytest.raises(MRCError, match=fragment):
        resolve_backbone(name, outputs_dir=tmp_path)
    with pytest.raises(MRCError, match="no config.json"):
        resolve_backbone(str(tmp_path), outputs_dir=tmp_path)


def test_vocab_is_the_same_file_in_every_process(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    code = ("import sys; sys.path.insert(0, 'src'); from mrc.vocab import build_vocab; "
            f"build_vocab({TEXTS * 3 + ['hello world 2024 hello world 2024 iphone iphone']!r}, sys.argv[1])")
    for name in ("a", "b"):
        subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], cwd=ROOT, check=True, capture_output=True, timeout=120)
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == (tmp_path / "b" / "vocab.txt").read_bytes()
    assert "hello" in (tmp_path / "a" / "vocab.txt").read_text(encoding="utf-8").split()
