"""Post-processing on hand-made logits, the no-answer decision, threshold tuning, the npz contract."""
import itertools

import numpy as np
import pytest

from mrc import metric, postprocess
from mrc.errors import MRCError
from mrc.postprocess import (NO_ANSWER, PAD_LOGIT, average_logits, best_span, decide, example_scores, load_logits,
                             make_logits, save_logits, tune_threshold)

CONTEXT = "燕园位于北京市海淀区，未名湖边有博雅塔。"
# token i covers character i (one character per token), tokens 0-2 are [CLS] q [SEP]
N_SPECIAL = 3


def _offsets(first_char, n_chars, width):
    off = np.full((width, 2), -1, dtype=np.int32)
    for t in range(n_chars):
        off[N_SPECIAL + t] = (first_char + t, first_char + t + 1)
    return off


def _feature(first_char, n_chars, width, start_at=None, end_at=None, cls=(0.0, 0.0), peak=5.0):
    start = np.full(width, -1.0, dtype=np.float32)
    end = np.full(width, -1.0, dtype=np.float32)
    start[0], end[0] = cls
    if start_at is not None:
        start[N_SPECIAL + start_at - first_char] = peak
        end[N_SPECIAL + end_at - first_char] = peak
    return start, end, _offsets(first_char, n_chars, width)


def _logits(feats, ids, answerable, key="k"):
    return make_logits(ids, np.stack([f[0] for f in feats]), np.stack([f[1] for f in feats]),
                       np.stack([f[2] for f in feats]), np.asarray(answerable, dtype=np.float32), key)


def test_best_span_respects_order_length_and_passage_only():
    width = 3 + 10
    start, end, off = _feature(0, 10, width, start_at=4, end_at=6)
    assert best_span(start, end, off) == (10.0, 4, 7)
    # end before start is never chosen, even with the highest logit
    end2 = end.copy()
    end2[N_SPECIAL + 1] = 9.0
    score, s, e = best_span(start, end2, off)
    assert s <= e - 1 and (s, e) == (4, 7)
    # too long an answer is cut out
    assert best_span(start, end, off, max_answer_tokens=2)[1:] != (4, 7)
    assert best_span(start, end, off, max_answer_chars=2)[1:] != (4, 7)
    # a huge logit on a question token ([CLS]/question/[SEP] have offset -1) is ignored
    start3 = start.copy()
    start3[1] = 50.0
    assert best_span(start3, end, off)[1:] == (4, 7)
    assert best_span(start, end, np.full((width, 2), -1, dtype=np.int32)) is None


def test_example_scores_over_windows():
    width = 3 + 12
    # example a: two windows over the context (chars 0-11 and 8-19); the answer "博雅塔" (16-19) is in window 2
    w1 = _feature(0, 12, width, start_at=2, end_at=3, cls=(2.0, 1.0), peak=1.0)
    w2 = _feature(8, 12, width, start_at=16, end_at=18, cls=(0.5, 0.5), peak=4.0)
    # example b: one window, strong [CLS]
    w3 = _feature(0, 12, width, start_at=4, end_at=6, cls=(6.0, 6.0), peak=2.0)
    logits = _logits([w1, w2, w3], ["a", "a", "b"], [[0.0, -1.0], [0.0, 2.0], [3.0, -3.0]])
    scores = example_scores(logits, {"a": CONTEXT, "b": CONTEXT})
    assert scores["a"]["text"] == "博雅塔" and scores["a"]["start"] == 16
    assert scores["a"]["score"] == pytest.approx(8.0)
    assert scores["a"]["null_score"] == pytest.approx(1.0)  # min over windows
    assert scores["a"]["p_answerable"] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-5)  # max over windows
    assert scores["b"]["text"] == CONTEXT[4:7] and scores["b"]["null_score"] == pytest.approx(12.0)
    with pytest.raises(MRCError, match="not in the input"):
        example_scores(logits, {"a": CONTEXT})


def test_decide_modes():
    scores = {"x": {"text": "博雅塔", "score": 8.0, "null_score": 1.0, "p_answerable": 0.9},
              "y": {"text": "海淀区", "score": 4.0, "null_score": 12.0, "p_answerable": 0.2},
              "z": {"text": "", "score": -np.inf, "null_score": 0.0, "p_answerable": 0.99}}
    assert decide(scores, 0.5, "prob") == {"x": "博雅塔", "y": NO_ANSWER, "z": NO_ANSWER}  # no span: never answered
    assert decide(scores, 0.1, "prob")["y"] == "海淀区"
    assert decide(scores, 0.0, "null") == {"x": "博雅塔", "y": NO_ANSWER, "z": NO_ANSWER}
    assert decide(scores, -10.0, "null")["y"] == "海淀区"
    assert decide(scores, 7.0, "null")["x"] == "博雅塔" and decide(scores, 7.5, "null")["x"] == NO_ANSWER
    with pytest.raises(MRCError, match="mode"):
        decide(scores, 0.5, "bogus")


def test_tune_threshold_matches_brute_force_with_the_official_metric():
    rng = np.random.default_rng(0)
    texts = ["博雅塔", "海淀区", "未名湖", "北京市", "燕园"]
    gold, scores = {}, {}
    for i in range(60):
        impossible = bool(rng.random() < 0.5)
        right = texts[i % 5]
        predicted = right if rng.random() < 0.7 else texts[(i + 1) % 5]
        # answerable questions tend to get higher P(answerable), not always
        p = float(np.clip(rng.normal(0.35 if impossible else 0.65, 0.2), 0, 1))
        gold[f"q{i}"] = {"answers": [] if impossible else [right], "is_impossible": impossible, "category": "in-domain"}
        scores[f"q{i}"] = {"text": predicted, "score": float(rng.normal()), "null_score": float(rng.normal()), "p_answerable": p}
    tuned = tune_threshold(scores, gold, modes=("prob", "null"))
    for mode in ("prob", "null"):
        values = sorted({s["p_answerable"] if mode == "prob" else s["score"] - s["null_score"] for s in scores.values()})
        candidates = [values[0] - 1] + values + [values[-1] + 1]
        best = max(metric.evaluate(gold, decide(scores, t, mode))["F1"] for t in candidates)
        assert tuned["F1"] >= best - 1e-9
    # the reported F1 is the official metric of the returned decision
    assert tuned["F1"] == pytest.approx(metric.evaluate(gold, decide(scores, tuned["threshold"], tuned["mode"]))["F1"])
    assert tuned["F1"] > metric.evaluate(gold, {q: NO_ANSWER for q in gold})["F1"]
    with pytest.raises(MRCError, match="no scores"):
        tune_threshold({}, gold)


def test_npz_roundtrip_and_averaging(tmp_path):
    width = 3 + 12
    feats = [_feature(0, 12, width, start_at=2, end_at=3), _feature(8, 12, width, start_at=16, end_at=18)]
    a = _logits(feats, ["a", "a"], [[0.0, 1.0], [1.0, 0.0]], key="f1|vocab=x|max_len=15|stride=4|title=1")
    save_logits(tmp_path / "a.npz", a)
    loaded = load_logits(tmp_path / "a.npz")
    assert loaded["feature_key"] == a["feature_key"]
    for k in ("start_logits", "end_logits", "offsets", "answerable_logits", "p_answerable", "example_id"):
        assert np.array_equal(loaded[k], a[k])
    b = dict(loaded, start_logits=loaded["start_logits"] + 2.0)
    mean = average_logits([loaded, b])
    assert np.allclose(mean["start_logits"], loaded["start_logits"] + 1.0)
    with pytest.raises(MRCError, match="feature_key"):
        average_logits([loaded, dict(b, feature_key="other")])
    with pytest.raises(MRCError, match="line up"):
        average_logits([loaded, dict(b, example_id=np.array(["a", "b"]))])
    np.savez(tmp_path / "bad.npz", start_logits=np.zeros(3))
    with pytest.raises(MRCError, match="not a logits file"):
        load_logits(tmp_path / "bad.npz")
    with pytest.raises(MRCError, match="do not line up"):
        make_logits(["a"], np.zeros((1, 4)), np.zeros((1, 5)), np.zeros((1, 4, 2)), np.zeros((1, 2)), "k")
    assert PAD_LOGIT < -1e3


def test_all_pairs_cover_exhaustive_search():
    """n-best over start/end equals exhaustive search when n_best covers every token."""
    rng = np.random.default_rng(1)
    width = 3 + 9
    off = _offsets(0, 9, width)
    for _ in range(20):
        start, end = rng.normal(size=width).astype(np.float32), rng.normal(size=width).astype(np.float32)
        brute = max((start[i] + end[j], i, j) for i, j in itertools.product(range(3, width), repeat=2) if 0 <= j - i < 4)
        score, s, e = best_span(start, end, off, n_best=width, max_answer_tokens=4)
        assert score == pytest.approx(brute[0]) and (s, e) == (off[brute[1], 0], off[brute[2], 1])


def test_rank_auc_and_diagnostics():
    assert postprocess.rank_auc([3.0, 2.0, 1.0], [True, False, False]) == 1.0
    assert postprocess.rank_auc([1.0, 2.0, -np.inf], [True, False, False]) == 0.5  # -inf (no span) ranks lowest
    assert postprocess.rank_auc([1.0, 1.0], [True, False]) == 0.5 and postprocess.rank_auc([1.0, 2.0], [True, True]) is None
    gold = {"a": {"answers": ["1898年"], "is_impossible": False, "type": "in-domain"},
            "b": {"answers": [], "is_impossible": True, "type": "in-domain"}}
    scores = {"a": {"text": "1898", "score": 5.0, "start": 0, "null_score": 1.0, "p_answerable": 0.9},
              "b": {"text": "北京", "score": 2.0, "start": 0, "null_score": 1.0, "p_answerable": 0.2}}
    d = postprocess.diagnostics(scores, gold)
    assert d["auc_prob"] == 1.0 and d["auc_null"] == 1.0 and 0 < d["answerable_span_F1"] < 100


def test_label_shift_weighting_matches_brute_force_and_answers_less():
    """With target_unanswerable_share the threshold maximises the F1 of the questions reweighted to that share
    (brute force over every cut: the same optimum); a higher unanswerable share never answers more."""
    from mrc.postprocess import label_shift_weights

    rng = np.random.default_rng(1)
    gold, scores = {}, {}
    for i in range(80):
        impossible = bool(rng.random() < 0.3)  # a training-like mix: 30% unanswerable
        gold[f"q{i}"] = {"answers": [] if impossible else ["博雅塔"], "is_impossible": impossible, "category": "in-domain"}
        text = "博雅塔" if rng.random() < 0.6 else "海淀区"
        p = float(np.clip(rng.normal(0.4 if impossible else 0.6, 0.2), 0, 1))
        scores[f"q{i}"] = {"text": text, "score": 0.0, "null_score": 0.0, "p_answerable": p}
    ids = list(gold)
    impossible = np.array([gold[i]["is_impossible"] for i in ids])
    w = label_shift_weights(impossible, 0.6)
    assert w[impossible].sum() / w.sum() == pytest.approx(0.6) and w.sum() == pytest.approx(len(ids))
    assert (label_shift_weights(impossible) == 1).all() and (label_shift_weights(np.zeros(5, bool), 0.6) == 1).all()
    with pytest.raises(MRCError, match="strictly between 0 and 1"):
        label_shift_weights(impossible, 1.0)

    def weighted_f1(threshold):
        pred = decide(scores, threshold, "prob")
        return 100 * sum(wi * metric.score_one(pred[i], gold[i])[0] for i, wi in zip(ids, w)) / w.sum()

    tuned = tune_threshold(scores, gold, modes=("prob",), target_unanswerable_share=0.6)
    values = sorted({s["p_answerable"] for s in scores.values()})
    best = max(weighted_f1(t) for t in [values[0] - 1] + values + [values[-1] + 1])
    assert tuned["weighted_F1"] == pytest.approx(best, abs=1e-3) == pytest.approx(weighted_f1(tuned["threshold"]), abs=1e-3)
    assert tuned["F1"] == pytest.approx(metric.evaluate(gold, decide(scores, tuned["threshold"], "prob"))["F1"])
    answered = [tune_threshold(scores, gold, ("prob",), target_unanswerable_share=t)["answered"] for t in (0.1, 0.3, 0.6, 0.9)]
    assert answered == sorted(answered, reverse=True) and answered[0] > answered[-1]


def test_expand_answers_grows_spans_to_their_clause_or_sentence():
    context = "孕妇吃扁桃仁一般不会导致病变,适量食用对宝宝有好处。不过要注意膳食搭配。"
    span = context.index("不会导致")
    rec = {"text": "不会导致", "start": span, "score": 1.0, "null_score": 0.0, "p_answerable": 0.9}
    empty = {"text": "", "start": -1, "score": -np.inf, "null_score": 0.0, "p_answerable": 0.1}
    scores = {"a": rec, "b": empty}
    contexts = {"a": context, "b": context}
    sentence = postprocess.expand_answers(scores, contexts, "sentence")
    assert sentence["a"]["text"] == "孕妇吃扁桃仁一般不会导致病变,适量食用对宝宝有好处" and sentence["a"]["start"] == 0
    clause = postprocess.expand_answers(scores, contexts, "clause")
    assert clause["a"]["text"] == "孕妇吃扁桃仁一般不会导致病变"
    assert sentence["b"] == empty and scores["a"]["text"] == "不会导致"  # no span stays none; the input is not changed
    assert postprocess.expand_answers(scores, contexts, None) is scores
    # a span that already ends its sentence keeps its end; one in the last sentence stops at the passage's end
    assert postprocess.expand_span(context, context.index("适量"), context.index("。") + 1, "sentence") == (0, context.index("。") + 1)
    assert postprocess.expand_span(context, context.index("膳食"), context.index("膳食") + 2, "sentence") == (context.index("不过"), len(context) - 1)
    with pytest.raises(MRCError, match="expand_to"):
        postprocess.expand_answers(scores, contexts, "paragraph")
