"""The stacked no-answer decision (mrc.answerability): overlap features mean what they say, the stacker
learns a real signal from out-of-fold scores, its plain-number parameters reproduce scikit-learn's
probabilities, and its threshold is tuned on cross-fitted scores."""
import json

import numpy as np
import pandas as pd
import pytest

from mrc import answerability, postprocess


def test_hand_features_measure_overlap_with_passage_and_title():
    names = answerability.HAND_FEATURES
    f = dict(zip(names, answerability.hand_features("北京大学创办于哪一年", "北京大学", "北京大学创办于1898年。")))
    assert f["q_bigrams_in_passage"] == pytest.approx(6 / 9)  # 北京 京大 大学 学创 创办 办于 of 9 bigrams
    assert f["q_bigrams_in_title"] == pytest.approx(3 / 9) and f["title_bigrams_in_question"] == 1.0
    assert f["no_title"] == 0.0 and f["q_words_missing_passage"] < f["q_words_missing_title"]
    g = dict(zip(names, answerability.hand_features("火星上有湖吗", None, "北京大学创办于1898年。")))
    assert g["no_title"] == 1.0 and g["q_bigrams_in_passage"] == 0.0 and g["q_words_missing_both"] == 1.0


def _scores_and_gold(n, rng):
    """Questions whose words are in the title exactly when answerable; the 'model' is noise."""
    scores, gold, rows = {}, {}, []
    for k in range(n):
        answerable = k % 2 == 0
        qid = f"q{k}"
        question = "北京大学创办于哪一年" if answerable else "火星上的湖叫什么名字"
        rows.append({"id": qid, "question": question, "title": "北京大学创办于", "context": "北京大学创办于1898年，位于海淀区。"})
        scores[qid] = {"text": "1898年", "score": float(rng.normal()), "start": 7, "null_score": float(rng.normal()),
                       "p_answerable": float(rng.uniform(0.2, 0.8))}
        gold[qid] = {"answers": ["1898年"] if answerable else [], "is_impossible": not answerable, "type": "in-domain"}
    return scores, gold, pd.DataFrame(rows)


def test_stacker_learns_the_title_signal_and_applies_in_numpy():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    scores, gold, df = _scores_and_gold(60, rng)
    hand = answerability.hand_feature_table(df)
    params = answerability.fit_stacker(scores, hand, gold, seed=1)
    json.dumps(params)  # plain numbers: goes into threshold.json
    crossed = np.array([scores[i]["p_stack"] for i in scores])  # cross-fitted on the OOF questions
    labels = np.array([not gold[i]["is_impossible"] for i in scores])
    assert postprocess.rank_auc(crossed, labels) > 0.95 and postprocess.rank_auc([scores[i]["p_answerable"] for i in scores], labels) < 0.75
    # numpy application == scikit-learn's own predict_proba with the same standardisation
    test, _, test_df = _scores_and_gold(10, rng)
    answerability.apply_stacker(test, answerability.hand_feature_table(test_df), params)
    X = answerability.stack_matrix(test, answerability.hand_feature_table(test_df), list(test))
    ids = [i for i in gold]
    Xtr = answerability.stack_matrix(scores, hand, ids)
    mean, scale = Xtr.mean(0), np.where(Xtr.std(0) < 1e-9, 1.0, Xtr.std(0))
    ref = LogisticRegression(C=1.0, max_iter=2000, random_state=1).fit((Xtr - mean) / scale, labels[[list(scores).index(i) for i in ids]])
    assert np.allclose([test[i]["p_stack"] for i in test], ref.predict_proba((X - mean) / scale)[:, 1], atol=1e-6)
    tuned = postprocess.tune_threshold(scores, gold, ["prob", "stack"])
    assert tuned["mode"] == "stack" and tuned["F1"] > 90


def test_stacker_skips_with_too_few_of_a_class_and_refuses_other_features():
    rng = np.random.default_rng(0)
    scores, gold, df = _scores_and_gold(8, rng)  # 4 of each class: too few for 5 cross-fitting folds
    assert answerability.fit_stacker(scores, answerability.hand_feature_table(df), gold) is None
    with pytest.raises(Exception, match="other features"):
        answerability.apply_stacker(scores, answerability.hand_feature_table(df), {"features": ["x"]})
    with pytest.raises(Exception, match="stacker"):
        postprocess.decision_value(scores["q0"], "stack")
