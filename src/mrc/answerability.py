"""The no-answer decision's third mode, "stack": P(answerable) from a logistic regression over the model's
scores and question/title/passage overlap features, fitted on out-of-fold predictions.

Why: a small model trained from scratch on a CPU learns late what simple counts show at once. On
dev_public, "share of the question's words absent from the title" alone ranks answerable above
unanswerable questions with ROC AUC 0.74, the model's own P(answerable) after 25 CPU minutes 0.63.
DuReader titles are usually the question the passage answers, so an unanswerable question tends to
ask for something the title does not name.

Features of one question (`hand_features`, plain counts; words by jieba, question stop words out):
shares of the question's character bigrams found in the passage / title, of the title's bigrams found in
the question, of the question's words missing from the passage / title / both (and how many), whether
there is a title, question and passage lengths. Stacked with the model's P(answerable) (as a logit),
its null-score difference and best-span length (`stack_matrix`).

Fitting (`fit_stacker`): standardised features, scikit-learn LogisticRegression; the out-of-fold
questions get cross-fitted probabilities (5 folds over the OOF set, so the threshold is tuned on scores
the stacker did not see), then one fit on all of them gives the parameters. The parameters are plain
numbers (JSON in threshold.json) and `apply_stacker` is numpy: prediction needs no scikit-learn object.
"""
from __future__ import annotations

import logging

import numpy as np

from .errors import MRCError

log = logging.getLogger(__name__)

# "is there a title" and the passage length also say which training set a question comes from; kept, as
# on dev_public they still help (stacker AUC 0.71 with them, 0.64 without, same model scores).
HAND_FEATURES = ("q_bigrams_in_passage", "q_bigrams_in_title", "title_bigrams_in_question", "no_title",
                 "q_words_missing_passage", "q_words_missing_title", "q_words_missing_both", "n_words_missing_both",
                 "question_chars", "log_passage_chars")
MODEL_FEATURES = ("logit_p_answerable", "null_difference", "log_span_chars")
FEATURES = MODEL_FEATURES + HAND_FEATURES
# function words of questions: asking about them says nothing about the passage
STOP_CHARS = set("的了吗呢吧啊是么什怎多少哪个些如何为有在和与及或")


def _bigrams(text: str) -> set:
    return {text[i:i + 2] for i in range(len(text) - 1)}


def question_words(question: str) -> list[str]:
    import jieba

    return [w for w in jieba.lcut(question) if w.strip() and not all(c in STOP_CHARS for c in w)]


def hand_features(question: str, title: str, passage: str) -> np.ndarray:
    question, passage = str(question), str(passage)
    title = title if isinstance(title, str) else ""
    qb, tb, pb = _bigrams(question), _bigrams(title), _bigrams(passage)
    words = question_words(question)
    n_words = max(1, len(words))
    miss_p = [w not in passage for w in words]
    miss_t = [w not in title for w in words]
    miss_both = sum(a and b for a, b in zip(miss_p, miss_t))
    return np.array([
        len(qb & pb) / max(1, len(qb)),
        len(qb & tb) / max(1, len(qb)) if title else 0.0,
        len(tb & qb) / max(1, len(tb)) if title else 0.0,
        float(not title),
        sum(miss_p) / n_words,
        sum(miss_t) / n_words if title else 1.0,
        miss_both / n_words,
        float(miss_both),
        len(question) / 20.0,
        float(np.log1p(len(passage))),
    ], dtype=np.float64)


def hand_feature_table(df) -> dict:
    """id -> hand features, for every row of a question table (mrc.data columns)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return {str(i): hand_features(q, t, c) for i, q, t, c in zip(df["id"], df["question"], df["title"], df["context"])}


def stack_matrix(scores: dict, hand: dict, ids) -> np.ndarray:
    rows = []
    for i in ids:
        if i not in hand:
            raise MRCError(f"id {i}: no question features for the stacked no-answer decision")
        rec = scores[i]
        p = min(max(float(rec["p_answerable"]), 1e-6), 1 - 1e-6)
        null_diff = float(rec["score"] - rec["null_score"]) if rec["text"] else -30.0
        model = [np.log(p / (1 - p)), float(np.clip(null_diff, -30.0, 30.0)), float(np.log1p(len(rec["text"])))]
        rows.append(np.concatenate([model, hand[i]]))
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURES))


def _probabilities(X: np.ndarray, params: dict) -> np.ndarray:
    z = (X - np.asarray(params["mean"])) / np.asarray(params["scale"])
    return 1.0 / (1.0 + np.exp(-(z @ np.asarray(params["coef"]) + float(params["intercept"]))))


def _fit(X: np.ndarray, y: np.ndarray, C: float, seed: int) -> dict:
    from sklearn.linear_model import LogisticRegression

    mean, scale = X.mean(axis=0), X.std(axis=0)
    scale[scale < 1e-9] = 1.0
    model = LogisticRegression(C=C, max_iter=2000, random_state=seed).fit((X - mean) / scale, y)
    return {"features": list(FEATURES), "mean": mean.tolist(), "scale": scale.tolist(),
            "coef": model.coef_[0].tolist(), "intercept": float(model.intercept_[0]), "C": C}


def fit_stacker(scores: dict, hand: dict, gold: dict, seed: int = 42, C: float = 1.0, folds: int = 5) -> dict:
    """Fit on the out-of-fold questions of `gold` (all with scores; `hand`: hand_feature_table of them);
    sets rec["p_stack"] on them from a cross-fitted stacker and returns the parameters of one fit on all
    (None, with a warning, when there are too few of either class: the "stack" mode is then not tried)."""
    from sklearn.model_selection import StratifiedKFold

    ids = [i for i in gold if i in scores]
    y = np.array([0 if gold[i]["is_impossible"] else 1 for i in ids])
    if len(set(y.tolist())) < 2 or min(np.bincount(y)) < folds:
        log.warning("stacked no-answer decision skipped: needs %d answerable and %d unanswerable out-of-fold "
                    "questions, has %d and %d", folds, folds, int(y.sum()), int(len(y) - y.sum()))
        return None
    X = stack_matrix(scores, hand, ids)
    crossed = np.zeros(len(ids))
    for fit_idx, held_idx in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, y):
        crossed[held_idx] = _probabilities(X[held_idx], _fit(X[fit_idx], y[fit_idx], C, seed))
    for i, p in zip(ids, crossed):
        scores[i]["p_stack"] = float(p)
    params = _fit(X, y, C, seed)
    params["questions"] = len(ids)
    log.debug("stacked no-answer decision fitted on %d out-of-fold questions; largest weights: %s", len(ids),
             ", ".join(f"{n} {c:+.2f}" for n, c in sorted(zip(FEATURES, params["coef"]), key=lambda t: -abs(t[1]))[:4]))
    return params


def describe(params: dict) -> str:
    return ", ".join(f"{n} {c:+.2f}" for n, c in sorted(zip(params["features"], params["coef"]), key=lambda t: -abs(t[1]))[:4])


def apply_stacker(scores: dict, hand: dict, params: dict) -> dict:
    """Sets rec["p_stack"] on every question of `scores` (`hand`: hand_feature_table of them); returns scores."""
    if list(params.get("features", [])) != list(FEATURES):
        raise MRCError("stacked no-answer decision: parameters were fitted on other features; retrain")
    ids = list(scores)
    X = stack_matrix(scores, hand, ids)
    for i, p in zip(ids, _probabilities(X, params)):
        scores[i]["p_stack"] = float(p)
    return scores
