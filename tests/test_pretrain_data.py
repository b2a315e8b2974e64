"""Pre-training data: sentences, masking units, instances (NSP / SOP / single segment), masking statistics,
and that evaluation passages never reach pre-training text."""
import random

import numpy as np
import pytest

from mrc.masking import MaskingConfig, candidate_units, mask_tokens, unit_spans, unit_start_flags
from mrc.pretrain_data import (
    PretrainingCollator, PretrainingDataset, TokenStore, build_instances, build_token_store, eval_sentences,
    iter_documents, split_sentences, tokenizer_ids, train_passages,
)

CORPUS_LINES = 200  # a tiny slice of the real corpus keeps these tests in seconds


def test_split_sentences_keeps_punctuation_and_closing_quotes():
    text = "今天下雨了。你带伞了吗？“带了！”他说。没有结尾的句子"
    assert split_sentences(text) == ["今天下雨了。", "你带伞了吗？", "“带了！”", "他说。", "没有结尾的句子"]
    assert split_sentences("  \n ") == []
    assert "".join(split_sentences("甲。乙！！丙？")) == "甲。乙！！丙？"


def test_unit_spans_words_and_ernie_knowledge_units():
    sentence = "北京大学的张三教授在上海参加了国际学术会议。"
    for mode in ("char", "word", "ernie"):
        spans = unit_spans(sentence, mode)
        # the units tile the sentence exactly
        assert [s for s, _, _ in spans] == [0] + [e for _, e, _ in spans[:-1]]
        assert spans[-1][1] == len(sentence)
    words = [sentence[s:e] for s, e, _ in unit_spans(sentence, "word")]
    assert "北京大学" in words and "上海" in words
    ernie = {sentence[s:e]: kind for s, e, kind in unit_spans(sentence, "ernie")}
    assert ernie["北京大学"] == "entity" and ernie["上海"] == "entity"  # jieba.posseg nt / ns
    assert ernie["国际学术会议"] == "phrase"  # adjacent noun words chunked into one unit
    with pytest.raises(ValueError):
        unit_spans(sentence, "bpe")


def test_unit_start_flags_follow_token_offsets():
    # tokens: 北 京 大 学 的 NC ##AA ; units: 北京大学 / 的 / NCAA
    offsets = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 7), (7, 9)]
    spans = [(0, 4, "entity"), (4, 5, "word"), (5, 9, "word")]
    assert unit_start_flags(offsets, spans).tolist() == [1, 0, 0, 0, 1, 1, 0]


def test_mask_tokens_takes_units_whole_and_never_specials():
    ids = np.array([2, 10, 11, 12, 13, 14, 15, 16, 17, 3], dtype=np.int64)
    units = np.array([1, 1, 0, 0, 1, 1, 0, 1, 1, 1], dtype=np.uint8)
    special = np.isin(ids, [2, 3])
    assert candidate_units(units, special) == [[1, 2, 3], [4], [5, 6], [7], [8]]
    config = MaskingConfig(masked_lm_prob=0.3, max_predictions_per_seq=5)
    for seed in range(200):
        out, pos, labels = mask_tokens(ids, units, special, random.Random(seed), config, 4, np.arange(5, 100))
        chosen = set(pos.tolist())
        assert len(chosen) == 3 and not chosen & {0, 9}
        for unit in candidate_units(units, special):
            assert len(chosen & set(unit)) in (0, len(unit))
        assert labels.tolist() == ids[pos].tolist()
        assert (out[~np.isin(np.arange(len(ids)), pos)] == ids[~np.isin(np.arange(len(ids)), pos)]).all()


# ------------------------------------------------------------------------------- real-text fixtures

@pytest.fixture(scope="module")
def text(data_dir):
    from mrc.data import corpus_path

    exclude = eval_sentences(["checklist_dev"], data_dir)
    docs = list(iter_documents(corpus_path(data_dir), [], CORPUS_LINES, exclude))
    return {"docs": docs, "exclude": exclude}


@pytest.fixture(scope="module")
def tokenizer(text, tmp_path_factory):
    from mrc.vocab import build_vocab, load_tokenizer

    out = build_vocab(("".join(d) for d in text["docs"]), tmp_path_factory.mktemp("vocab"))
    return load_tokenizer(str(out))


@pytest.fixture(scope="module")
def stores(text, tokenizer, tmp_path_factory):
    from mrc.vocab import fast_tokenizer

    root = tmp_path_factory.mktemp("stores")
    fast = fast_tokenizer(tokenizer)
    return {mode: TokenStore(build_token_store(iter(text["docs"]), fast, mode, root / mode))
            for mode in ("char", "word", "ernie")}


def instances(stores, tokenizer, tmp_path_factory, mode, pair_task, dupe_factor=1, max_seq_len=128, seed=7):
    ids = tokenizer_ids(tokenizer)
    out = tmp_path_factory.mktemp(f"inst_{mode}_{pair_task}")
    build_instances(stores[mode], out / "i", ids["cls"], ids["sep"], max_seq_len, 0.1, pair_task, dupe_factor,
                    random.Random(seed))
    return PretrainingDataset(out / "i")


def _find(haystack: np.ndarray, needle: np.ndarray) -> int:
    """Index of the first occurrence of `needle` in `haystack` (int arrays), -1 if absent."""
    hay, pat = haystack.astype("<i4").tobytes(), needle.astype("<i4").tobytes()
    pos = hay.find(pat)
    while pos != -1 and pos % 4:
        pos = hay.find(pat, pos + 1)
    return pos // 4 if pos != -1 else -1


def _follows(doc: np.ndarray, first: np.ndarray, second: np.ndarray) -> bool:
    """`second` occurs somewhere after the first occurrence of `first` in doc (text may repeat in news)."""
    pos = _find(doc, first)
    return pos >= 0 and _find(doc[pos + 1:], second) >= 0


def _doc_ids(store, d):
    return np.concatenate([ids for ids, _ in store.document(d)])


def test_token_store_round_trips_documents(stores, text, tokenizer):
    store = stores["char"]
    assert len(store) == len(text["docs"])
    assert store.meta["sentences"] == sum(len(d) for d in text["docs"])
    from mrc.vocab import fast_tokenizer

    first = fast_tokenizer(tokenizer).encode(text["docs"][3][0], add_special_tokens=False).ids
    assert store.document(3)[0][0].tolist() == first
    # word/ernie stores hold the same tokens, only the unit flags differ
    assert np.array_equal(np.asarray(stores["word"].ids), np.asarray(store.ids))
    assert np.asarray(stores["char"].unit_start).all()
    assert 0.2 < np.asarray(stores["word"].unit_start).mean() < 0.9


def test_nsp_is_balanced_and_negatives_come_from_other_documents(stores, tokenizer, tmp_path_factory):
    ds = instances(stores, tokenizer, tmp_path_factory, "char", "nsp")
    store = stores["char"]
    labels = np.asarray(ds.label)
    assert len(ds) > 1000 and abs(labels.mean() - 0.5) < 0.03
    sep = tokenizer.sep_token_id
    for i in range(0, len(ds), 7):
        item = ds[i]
        ids, len_a = item["input_ids"], int(ds.len_a[i])
        assert ids[0] == tokenizer.cls_token_id and ids[len_a + 1] == sep and ids[-1] == sep
        assert item["token_type_ids"][: len_a + 2].sum() == 0 and item["token_type_ids"][len_a + 2:].all()
        a, b = ids[1: len_a + 1], ids[len_a + 2: -1]
        a_doc, b_doc = int(ds.a_doc[i]), int(ds.b_doc[i])
        assert _find(_doc_ids(store, a_doc), a) >= 0
        assert _find(_doc_ids(store, b_doc), b) >= 0  # B really is text of the document it is said to come from
        if item["label"] == 1:
            assert b_doc != a_doc
        else:
            assert b_doc == a_doc and _follows(_doc_ids(store, a_doc), a, b)  # B follows A in the same document


def test_sop_negatives_are_swapped_segments(stores, tokenizer, tmp_path_factory):
    ds = instances(stores, tokenizer, tmp_path_factory, "char", "sop")
    store = stores["char"]
    labels = np.asarray(ds.label)
    assert len(ds) > 1000 and abs(labels.mean() - 0.5) < 0.03
    assert (np.asarray(ds.a_doc) == np.asarray(ds.b_doc)).all()  # SOP never leaves the document
    for i in range(0, len(ds), 7):
        ids, len_a = ds[i]["input_ids"], int(ds.len_a[i])
        a, b = ids[1: len_a + 1], ids[len_a + 2: -1]
        doc = _doc_ids(store, int(ds.a_doc[i]))
        assert _follows(doc, b, a) if ds.label[i] == 1 else _follows(doc, a, b)


def test_single_segment_instances_for_no_pair_task(stores, tokenizer, tmp_path_factory):
    ds = instances(stores, tokenizer, tmp_path_factory, "word", "none")
    for i in range(0, len(ds), 5):
        item = ds[i]
        ids = item["input_ids"]
        assert len(ids) <= 128 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert (ids[1:-1] != tokenizer.sep_token_id).all() and not item["token_type_ids"].any()
        assert item["label"] == 0


def masking_stats(ds, collator, n=10_000):
    """Statistics of n masked instances (instance i % len(ds), each with its own mask)."""
    special_ids = set(collator.special_ids.tolist())
    tokens = masked = as_mask = as_random = as_kept = special_masked = broken_units = 0
    in_multi = 0
    for i in range(n):
        example = dict(ds[i % len(ds)], index=i)
        out, pos, labels = collator.mask(example)
        ids = example["input_ids"]
        tokens += len(ids)
        masked += len(pos)
        as_mask += int((out[pos] == collator.mask_id).sum())
        as_kept += int((out[pos] == ids[pos]).sum())
        special_masked += sum(int(t) in special_ids for t in ids[pos])
        chosen = set(pos.tolist())
        special = np.isin(ids, collator.special_ids)
        for unit in candidate_units(example["unit_start"], special):
            hit = len(chosen & set(unit))
            broken_units += hit not in (0, len(unit))
            in_multi += hit if len(unit) > 1 else 0
    as_random = masked - as_mask - as_kept
    return {"masked_fraction": masked / tokens, "mask": as_mask / masked, "random": as_random / masked,
            "kept": as_kept / masked, "special_masked": special_masked, "broken_units": broken_units,
            "in_multi_token_units": in_multi / masked}


@pytest.mark.parametrize("mode,pair_task", [("char", "nsp"), ("word", "none"), ("ernie", "nsp")])
def test_masking_statistics_over_10k_instances(stores, tokenizer, tmp_path_factory, mode, pair_task):
    ds = instances(stores, tokenizer, tmp_path_factory, mode, pair_task)
    collator = PretrainingCollator(tokenizer_ids(tokenizer), len(tokenizer), MaskingConfig(), seed=1, dynamic=False)
    stats = masking_stats(ds, collator)
    print(mode, pair_task, {k: round(v, 4) for k, v in stats.items()})
    assert abs(stats["masked_fraction"] - 0.15) < 0.01
    assert abs(stats["mask"] - 0.8) < 0.02 and abs(stats["random"] - 0.1) < 0.02 and abs(stats["kept"] - 0.1) < 0.02
    assert stats["special_masked"] == 0
    assert stats["broken_units"] == 0  # words / phrases / entities are masked whole
    if mode == "char":
        assert stats["in_multi_token_units"] < 0.02  # only WordPiece continuations of latin words
    else:
        assert stats["in_multi_token_units"] > 0.4  # most masked characters belong to multi-character units


def test_static_masks_repeat_across_epochs_dynamic_masks_do_not(stores, tokenizer, tmp_path_factory):
    ds = instances(stores, tokenizer, tmp_path_factory, "char", "nsp")
    ids = tokenizer_ids(tokenizer)
    static = PretrainingCollator(ids, len(tokenizer), MaskingConfig(), seed=3, dynamic=False)
    dynamic = PretrainingCollator(ids, len(tokenizer), MaskingConfig(), seed=3, dynamic=True)
    same_static = same_dynamic = 0
    for i in range(200):
        masks = {}
        for name, collator in (("static", static), ("dynamic", dynamic)):
            collator.epoch = 0
            first = collator.mask(ds[i])[1].tolist()
            collator.epoch = 1
            masks[name] = first == collator.mask(ds[i])[1].tolist()
            collator.epoch = 0
            assert collator.mask(ds[i])[1].tolist() == first  # same seed, same epoch -> same mask
        same_static += masks["static"]
        same_dynamic += masks["dynamic"]
    assert same_static == 200 and same_dynamic < 10


def test_collator_batches_flatten_masked_positions(stores, tokenizer, tmp_path_factory):
    ds = instances(stores, tokenizer, tmp_path_factory, "char", "sop")
    collator = PretrainingCollator(tokenizer_ids(tokenizer), len(tokenizer), MaskingConfig(), seed=0, dynamic=False)
    examples = [ds[i] for i in range(6)]
    batch = collator(examples)
    width = max(len(e["input_ids"]) for e in examples)
    assert batch["input_ids"].shape == (6, width)  # dynamic padding: the longest in the batch
    assert batch["attention_mask"].sum() == sum(len(e["input_ids"]) for e in examples)
    rows, cols = np.divmod(batch["masked_positions"], width)
    original = np.full((6, width), tokenizer.pad_token_id)
    for r, e in enumerate(examples):
        original[r, : len(e["input_ids"])] = e["input_ids"]
    assert (original[rows, cols] == batch["masked_lm_labels"]).all()
    assert (batch["attention_mask"][rows, cols] == 1).all()
    assert batch["next_sentence_labels"].tolist() == [e["label"] for e in examples]


# ----------------------------------------------------------------------------------- evaluation text

def test_eval_sentences_are_dropped_from_training_text(data_dir, tmp_path):
    exclude = eval_sentences(["checklist_dev"], data_dir)
    assert len(exclude) > 1000
    dev_sentence = next(s for s in sorted(exclude) if s.endswith("。") and s[0] not in "”’」』）)\"'")
    stats = {}
    docs = list(iter_documents(None, ["训练段落的第一句。" + dev_sentence + "训练段落的最后一句。"], exclude=exclude,
                               stats=stats))
    assert docs == [["训练段落的第一句。", "训练段落的最后一句。"]] and stats["excluded_sentences"] == 1


def test_train_passages_refuse_evaluation_sources(data_dir):
    from mrc.errors import MRCError

    with pytest.raises(MRCError, match="checklist_dev"):
        train_passages(["checklist_demo", "checklist_dev"], data_dir)


def test_pretraining_text_never_comes_from_an_evaluation_set():
    from mrc.errors import MRCError
    from mrc.pretrain_data import train_passages

    with pytest.raises(MRCError, match="checklist_dev is evaluation data and never pre-training text"):
        train_passages(["robust_dev", "checklist_dev"])
    with pytest.raises(MRCError, match="unknown set nope"):
        train_passages(["nope"])
