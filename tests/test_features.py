"""Features: windows cover the passage with HF stride overlap, offsets map back to the exact answer
text, labels fall on [CLS] when the window lacks the answer, and the layout key is deterministic."""
import numpy as np
import pandas as pd
import pytest

from mrc.errors import MRCError
from mrc.features import build_features, feature_key, window_starts
from mrc.vocab import build_vocab, fast_tokenizer, load_tokenizer

PASSAGE = ("北京大学创办于1898年，初名京师大学堂，是中国近代第一所国立综合性大学。"
           "学校位于北京市海淀区，校园被称为燕园。The campus hosts Peking University Library，"
           "藏书约1100万册。未名湖是燕园的标志性景观，湖边有博雅塔。学校现有教职工约两万人。") * 2


def _row(qid, question, context, answer=None, title="北京大学", nth=0):
    if answer is None:
        return {"id": qid, "question": question, "title": title, "context": context, "answers": [], "is_impossible": True}
    start = -1
    for _ in range(nth + 1):
        start = context.index(answer, start + 1)
    return {"id": qid, "question": question, "title": title, "context": context,
            "answers": [{"text": answer, "answer_start": start}], "is_impossible": False}


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    texts = [PASSAGE, "北京大学创办于哪一年", "未名湖边有什么塔", "学校有多少教职工", "图书馆藏书多少", "火星上有湖吗", "北京大学"]
    return fast_tokenizer(load_tokenizer(build_vocab(texts * 3, tmp_path_factory.mktemp("vocab"))))


@pytest.fixture(scope="module")
def examples():
    return pd.DataFrame([
        _row("q1", "北京大学创办于哪一年", PASSAGE, "1898年"),
        _row("q2", "未名湖边有什么塔", PASSAGE, "博雅塔", nth=1),  # the second occurrence: only late windows
        _row("q3", "学校有多少教职工", PASSAGE, "约两万人"),
        _row("q4", "图书馆藏书多少", PASSAGE, "约1100万册"),
        _row("q5", "火星上有湖吗", PASSAGE),
    ])


def _span_text(feats, i, context):
    s, e = feats.start_positions[i], feats.end_positions[i]
    return context[feats.offsets[i][s, 0]: feats.offsets[i][e, 1]]


@pytest.mark.parametrize("max_len,stride", [(64, 16), (96, 32), (512, 128)])
@pytest.mark.parametrize("use_title", [True, False])
def test_labels_map_back_to_exact_answer_text_and_cls_outside(fast, examples, max_len, stride, use_title):
    feats = build_features(examples, fast, max_len, stride, use_title)
    hits = {qid: 0 for qid in examples["id"]}
    for i in range(len(feats)):
        row = examples.iloc[feats.example_index[i]]
        assert len(feats.input_ids[i]) <= max_len
        passage_chars = feats.offsets[i][feats.offsets[i][:, 0] >= 0]
        if feats.start_positions[i] > 0:
            assert feats.answerable[i] == 1
            assert _span_text(feats, i, row.context) == row.answers[0]["text"]
            assert feats.offsets[i][feats.start_positions[i], 0] == row.answers[0]["answer_start"]
            hits[row.id] += 1
        else:
            assert feats.end_positions[i] == 0 and feats.answerable[i] == 0
            if not row.is_impossible:  # the window really lacks the whole answer
                a0 = row.answers[0]["answer_start"]
                a1 = a0 + len(row.answers[0]["text"])
                assert not (passage_chars[0, 0] <= a0 and passage_chars[-1, 1] >= a1)
    assert hits["q5"] == 0
    assert all(hits[q] >= 1 for q in ("q1", "q2", "q3", "q4"))


@pytest.mark.parametrize("max_len,stride", [(64, 16), (80, 40), (128, 0)])
def test_windows_cover_the_passage_with_stride_overlap(fast, examples, max_len, stride):
    feats = build_features(examples.iloc[:1], fast, max_len, stride, use_title=True)
    passage_tokens = fast.encode(PASSAGE, add_special_tokens=False).offsets
    assert len(feats) > 1, "the passage must need several windows at this size"
    windows = [[tuple(o) for o in off if o[0] >= 0] for off in feats.offsets]
    covered = set().union(*map(set, windows))
    assert covered == set(map(tuple, passage_tokens))
    for a, b in zip(windows, windows[1:]):
        assert a[-stride:] == b[:stride] if stride else a[-1] < b[0]  # HF semantics: `stride` tokens shared
        assert len(set(a) & set(b)) == stride
    # layout: [CLS] question [SEP] title [SEP] passage [SEP]; segment B is exactly the passage + final [SEP]
    cls_id, sep_id = fast.token_to_id("[CLS]"), fast.token_to_id("[SEP]")
    for ids, types, off in zip(feats.input_ids, feats.token_type_ids, feats.offsets):
        assert ids[0] == cls_id and ids[-1] == sep_id and (ids == sep_id).sum() == 3
        assert ((off[:, 0] >= 0) == ((types == 1) & (np.arange(len(ids)) < len(ids) - 1))).all()


def test_title_in_segment_a_and_key(fast, examples):
    with_title = build_features(examples, fast, 96, 32, use_title=True)
    without = build_features(examples, fast, 96, 32, use_title=False)
    title_ids = fast.encode("北京大学", add_special_tokens=False).ids
    seg_a = with_title.input_ids[0][with_title.token_type_ids[0] == 0].tolist()
    assert seg_a[-len(title_ids) - 1: -1] == title_ids
    assert len(without.input_ids[0][without.token_type_ids[0] == 0]) == len(seg_a) - len(title_ids) - 1
    assert with_title.key != without.key
    assert with_title.key == feature_key(fast, 96, 32, True) != feature_key(fast, 96, 48, True)
    again = build_features(examples, fast, 96, 32, use_title=True)
    assert all(np.array_equal(a, b) for a, b in zip(with_title.input_ids, again.input_ids))
    assert with_title.start_positions == again.start_positions


def test_bad_sizes_are_one_line_errors(fast, examples):
    with pytest.raises(MRCError, match="stride"):
        build_features(examples, fast, 64, 60, True)
    with pytest.raises(MRCError):
        window_starts(10, 0, 0)


def test_real_data_answers_recovered(data_dir, tmp_path):
    from mrc.data import labelled, load_sources

    df = labelled(load_sources(["checklist_demo", "robust_demo", "cmrc2018_trial"], data_dir)).reset_index(drop=True)
    texts = list(df["context"]) + list(df["question"]) + list(df["title"])
    fast = fast_tokenizer(load_tokenizer(build_vocab(texts, tmp_path / "vocab")))
    feats = build_features(df, fast, 256, 64, use_title=True)
    exact = labelled_feats = 0
    found = set()
    for i in range(len(feats)):
        if feats.start_positions[i] > 0:
            row = df.iloc[feats.example_index[i]]
            text = _span_text(feats, i, row.context)
            labelled_feats += 1
            exact += text == row.answers[0]["text"]
            # at worst widened to whole tokens; the normaliser strips accents, so a trailing combining
            # mark (Hebrew points) falls outside the last token's offsets
            assert _no_marks(row.answers[0]["text"]) in _no_marks(text)
            found.add(row.id)
    answerable = set(df.loc[~df["is_impossible"], "id"])
    assert exact / labelled_feats > 0.99
    assert len(found) / len(answerable) > 0.97  # the rest: answers cut mid-token or longer than a window



def _no_marks(text):
    import unicodedata

    return "".join(ch for ch in text if unicodedata.category(ch) != "Mn")


def test_bigram_match_marks_shared_bigrams_only():
    from mrc.features import bigram_match

    # 北京大学创办于 shares bigrams with the other text; 哪一年 does not (年 only as "8年")
    assert bigram_match("北京大学创办于哪一年", "北京大学创办于1898年").tolist() == [True] * 7 + [False] * 3
    assert bigram_match("创于", "创办于").tolist() == [False, False]
    assert bigram_match("", "abc").tolist() == [] and bigram_match("ab", "").tolist() == [False, False]


def test_match_types_mark_question_words_in_the_passage_and_back(fast, examples):
    from mrc.features import NUM_MATCH_TYPES

    plain = build_features(examples, fast, 96, 32, use_title=True)
    matched = build_features(examples, fast, 96, 32, use_title=True, match_types=True)
    assert matched.key == plain.key + "|match=1"
    for i in range(len(plain)):
        p, m = plain.token_type_ids[i], matched.token_type_ids[i]
        assert np.array_equal(plain.input_ids[i], matched.input_ids[i]) and m.max() < NUM_MATCH_TYPES
        assert np.array_equal(p == 1, (m == 1) | (m == 2))  # passage tokens keep segment B
        assert np.array_equal(p == 0, ~((m == 1) | (m == 2)))
    vocab = {v: k for k, v in fast.get_vocab().items()}
    first = matched.example_id.index("q5")  # "火星上有湖吗": only 湖 is in the passage, but no bigram through it
    types, ids = matched.token_type_ids[first], matched.input_ids[first]
    question = [vocab[t] for t in ids[1:7]]
    assert question == list("火星上有湖吗") and set(types[1:7]) == {6}
    assert vocab[ids[8]] + vocab[ids[9]] == "北京" and list(types[7:13]) == [0] * 6  # [SEP] + title 北京大学 + [SEP]
    first = matched.example_id.index("q1")  # "北京大学创办于哪一年", title "北京大学"
    types, ids = matched.token_type_ids[first], matched.input_ids[first]
    passage = [(vocab[t], ty) for t, ty, off in zip(ids, types, matched.offsets[first]) if off[0] >= 0]
    assert [ty for _, ty in passage[:7]] == [2] * 7 and passage[7][1] == 1  # "1898" follows: no match
    # question: 北京大学 in passage and title (3), 创办于 in the passage only (4), 哪一年 nowhere (6); title all found (7)
    assert list(types[1:11]) == [3] * 4 + [4] * 3 + [6] * 3 and list(types[11:17]) == [0, 7, 7, 7, 7, 0]


def test_extend_token_types_keeps_old_rows_and_reloads(tmp_path, fast):
    import paddle

    from mrc.backbone import arch_classes
    from mrc.model import extend_token_types

    classes = arch_classes("ernie")
    encoder = classes.model(classes.config(vocab_size=fast.get_vocab_size(), hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=64, type_vocab_size=2))
    old = encoder.embeddings.token_type_embeddings.weight.numpy().copy()
    assert extend_token_types(encoder, 8) and not extend_token_types(encoder, 8)
    new = encoder.embeddings.token_type_embeddings.weight.numpy()
    assert new.shape == (8, 32) and np.array_equal(new[:2], old) and all(np.array_equal(new[i], old[1]) for i in range(2, 8))
    encoder.config.save_pretrained(str(tmp_path))
    paddle.save(encoder.state_dict(), str(tmp_path / "w.pdparams"))
    again = classes.model(classes.config.from_pretrained(str(tmp_path)))
    again.set_state_dict(paddle.load(str(tmp_path / "w.pdparams")))
    assert np.array_equal(again.embeddings.token_type_embeddings.weight.numpy(), new)
