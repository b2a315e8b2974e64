"""mrc.headroom on hand-made questions: span variants, oracles, decision values and the best-threshold bound."""
import numpy as np

from mrc import answerability, headroom, metric, postprocess

CONTEXT = "北京是中国的首都，人口很多。长城在北京的北边，很有名。"


def questions(n=12):
    """Half answerable (gold: the second sentence's first clause), half not; the model's span (no character in common with the gold) sits in sentence one."""
    scores, contexts, gold, hand = {}, {}, {}, {}
    for k in range(n):
        i = f"q{k}"
        answerable = k % 2 == 0
        contexts[i] = CONTEXT
        gold[i] = {"answers": ["长城在北京的北边"] if answerable else [], "is_impossible": not answerable, "category": "in-domain"}
        scores[i] = {"text": "人口很多", "start": 9, "score": 1.0, "null_score": 0.0, "p_answerable": 0.9 if answerable else 0.1}
        hand[i] = answerability.hand_features("长城在哪里" if answerable else "故宫在哪里", "长城", CONTEXT)
    return scores, contexts, gold, hand


def test_units_leave_the_closing_marks_out_and_skip_blank_pieces():
    assert headroom.units("甲乙。丙，丁！ \n", postprocess.SENTENCE_ENDS) == [(0, 2), (3, 6)]
    assert headroom.units("甲乙。丙，丁！", postprocess.CLAUSE_ENDS) == [(0, 2), (3, 4), (5, 6)]
    assert headroom.units("", postprocess.SENTENCE_ENDS) == [(0, 0)]


def test_span_variants_grow_the_model_span_and_the_oracles_find_the_gold_sentence():
    scores, contexts, gold, _ = questions()
    spans = headroom.span_variants(scores, contexts, gold, metric)
    assert set(spans) == set(headroom.SPANS)
    assert spans["model"]["q0"] == spans["clause"]["q0"] == "人口很多" and spans["sentence"]["q0"] == "北京是中国的首都，人口很多"
    assert spans["first_sentence"]["q0"] == "北京是中国的首都，人口很多"
    assert spans["best_sentence"]["q0"] == "长城在北京的北边，很有名"
    assert spans["best_clauses"]["q0"] == "长城在北京的北边"


def test_headroom_bounds_with_a_perfect_decision_value():
    scores, contexts, gold, hand = questions()
    result = headroom.headroom(scores, contexts, gold, hand, metric, seed=0)
    assert result["questions"] == 12 and result["answerable"] == 6 and result["no_answer_F1"] == 50.0
    assert result["spans"]["best_clauses"] == 100.0 and result["spans"]["model"] == 0.0
    assert 0 < result["spans"]["first_sentence"] < result["spans"]["best_sentence"] < 100.0
    # P(answerable) separates the classes perfectly: answering exactly the answerable ones with the oracle scores 100
    assert result["auc"]["model P(answerable)"] == 1.0
    assert result["best_F1"]["model P(answerable)"]["best_clauses"] == (100.0, 6)
    # a span worth nothing is best not answered at all: the bound falls back to 'no answer' everywhere
    assert result["best_F1"]["model P(answerable)"]["model"] == (50.0, 0)
    assert "hand features (LR cross-fitted here)" in result["auc"]
    for row in result["best_F1"].values():
        assert all(f1 >= result["no_answer_F1"] for f1, _ in row.values())
    text = headroom.markdown(result, actual_f1=50.0)
    assert "| model P(answerable) | 1.000 |" in text and "100.00 (6)" in text and "this run's F1 50.000" in text


def test_crossfit_probabilities_never_see_their_own_row():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.array([0, 1] * 20)
    p = headroom.crossfit_probabilities(X, y, seed=0)
    assert p.shape == (40,) and ((p > 0) & (p < 1)).all()
    # labels that are pure noise: cross-fitted probabilities do not rank them well (in-sample fits would)
    assert postprocess.rank_auc(p, y.astype(bool)) < 0.75
