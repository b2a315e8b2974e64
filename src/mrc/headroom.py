"""Headroom of a trained run on a labelled target set: how far its F1 could go with better spans or a better
no-answer decision, so the next experiment goes where the points are.

Every figure answers one question "what if": the answer spans (the model's, grown to the clause or sentence,
the passage's first sentence, and two oracles that read the gold answer: the best single sentence and the best
run of one to three clauses) crossed with the decision values that rank questions for answering (the model's
P(answerable) and null-score difference, a logistic regression over mrc.answerability's question/title/passage
features, and over those features plus the model's, both cross-fitted on the target set itself). For each pair,
the F1 of the best threshold chosen on the target set itself (an upper bound: the threshold sees the answers)
via postprocess.tune_threshold, the same official-metric scoring the real decision uses.
Plain numpy and scikit-learn; nothing here feeds back into training or prediction.
"""
from __future__ import annotations

import numpy as np

from . import answerability, postprocess
from .errors import MRCError

SPANS = ("model", "clause", "sentence", "first_sentence", "best_sentence", "best_clauses")
ORACLE_SPANS = ("best_sentence", "best_clauses")


def units(context: str, stops) -> list[tuple[int, int]]:
    """[start, end) of every non-blank sentence/clause of `context`, its closing mark left out (as expand_span does)."""
    out, start = [], 0
    for j, ch in enumerate(context):
        if ch in stops:
            if context[start:j].strip():
                out.append((start, j))
            start = j + 1
    if context[start:].strip():
        out.append((start, len(context)))
    return out or [(0, len(context))]


def span_variants(scores: dict, contexts: dict, gold: dict, metric) -> dict:
    """name -> {id: answer text} for every name of SPANS (the oracles use `gold`)."""
    f1 = lambda i, text: metric.score_one(text, gold[i])[0] if text else 0.0  # noqa: E731
    out = {"model": {i: rec["text"] for i, rec in scores.items()}}
    for unit in ("clause", "sentence"):
        out[unit] = {i: rec["text"] for i, rec in postprocess.expand_answers(scores, contexts, unit).items()}
    out["first_sentence"], out["best_sentence"], out["best_clauses"] = {}, {}, {}
    for i in scores:
        context = contexts[i]
        sentences = units(context, postprocess.SENTENCE_ENDS)
        clauses = units(context, postprocess.CLAUSE_ENDS)
        out["first_sentence"][i] = context[slice(*sentences[0])]
        out["best_sentence"][i] = max((context[a:b] for a, b in sentences), key=lambda t: f1(i, t))
        runs = (context[clauses[k][0]:clauses[min(k + n, len(clauses) - 1)][1]] for k in range(len(clauses)) for n in range(3))
        out["best_clauses"][i] = max(runs, key=lambda t: f1(i, t))
    return out


def crossfit_probabilities(X: np.ndarray, y: np.ndarray, seed: int, folds: int = 5) -> np.ndarray:
    """P(answerable) of each row from a logistic regression fitted on the other folds (standardised features)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    X = (X - X.mean(axis=0)) / np.where(X.std(axis=0) < 1e-9, 1.0, X.std(axis=0))
    out = np.zeros(len(y))
    for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, y):
        out[held] = LogisticRegression(max_iter=3000, random_state=seed).fit(X[fit], y[fit]).predict_proba(X[held])[:, 1]
    return out


def decision_values(scores: dict, hand: dict, ids: list, answerable: np.ndarray, seed: int) -> dict:
    """name -> array over `ids` of a value that ranks questions for answering (higher: answer)."""
    model = answerability.stack_matrix(scores, hand, ids)  # model features first, then the hand features
    n_model = len(answerability.MODEL_FEATURES)
    values = {"model P(answerable)": np.array([scores[i]["p_answerable"] for i in ids]),
              "model null difference": model[:, 1]}
    folds = int(min(5, answerable.sum(), (~answerable).sum()))
    if folds >= 2:
        y = answerable.astype(int)
        values["hand features (LR cross-fitted here)"] = crossfit_probabilities(model[:, n_model:], y, seed, folds)
        values["model + hand features (LR cross-fitted here)"] = crossfit_probabilities(model, y, seed, folds)
    return values


def headroom(scores: dict, contexts: dict, gold: dict, hand: dict, metric, seed: int = 42) -> dict:
    """{"spans": {name: answerable span F1}, "auc": {decision: AUC}, "best_F1": {decision: {span: (F1, answered)}},
    "no_answer_F1"} over the ids of `gold` (all must have scores)."""
    ids = [i for i in gold if i in scores]
    if len(ids) != len(gold):
        raise MRCError(f"headroom: no scores for {len(gold) - len(ids)} of the {len(gold)} labelled ids")
    scores, contexts = {i: scores[i] for i in ids}, {i: contexts[i] for i in ids}
    answerable = np.array([not gold[i]["is_impossible"] for i in ids], dtype=bool)
    spans = span_variants(scores, contexts, gold, metric)
    out = {"questions": len(ids), "answerable": int(answerable.sum()), "spans": {}, "auc": {}, "best_F1": {}}
    for name, texts in spans.items():
        f1 = [metric.score_one(texts[i], gold[i])[0] for i, a in zip(ids, answerable) if a and texts[i]]
        out["spans"][name] = round(100.0 * float(np.sum(f1)) / max(1, int(answerable.sum())), 2)
    out["no_answer_F1"] = round(100.0 * float((~answerable).mean()), 3)
    for decision, values in decision_values(scores, hand, ids, answerable, seed).items():
        auc = postprocess.rank_auc(values, answerable)
        out["auc"][decision] = None if auc is None else round(auc, 3)
        out["best_F1"][decision] = {}
        for name, texts in spans.items():
            ranked = {i: {"text": texts[i], "p_answerable": float(v)} for i, v in zip(ids, values)}
            tuned = postprocess.tune_threshold(ranked, gold, ["prob"], metric)
            out["best_F1"][decision][name] = (round(tuned["F1"], 3), tuned["answered"])
    return out


def markdown(result: dict, actual_f1: float | None = None) -> str:
    """The headroom as one table: a row per decision value, a column per answer span."""
    lines = [f"{result['questions']} questions ({result['answerable']} answerable); 'no answer' everywhere F1 "
             f"{result['no_answer_F1']:.3f}" + ("" if actual_f1 is None else f"; this run's F1 {actual_f1:.3f}"), "",
             "answerable span F1 (every answerable question answered with that span): "
             + ", ".join(f"{n} {v:.1f}" for n, v in result["spans"].items()), "",
             "best F1 with the threshold chosen on these questions themselves (answered), by decision value x span:", "",
             "| decision value | AUC | " + " | ".join(SPANS) + " |", "|---|---|" + "---|" * len(SPANS)]
    for decision, row in result["best_F1"].items():
        auc = result["auc"][decision]
        lines.append(f"| {decision} | {'-' if auc is None else f'{auc:.3f}'} | "
                     + " | ".join(f"{row[s][0]:.2f} ({row[s][1]})" for s in SPANS) + " |")
    lines += ["", f"{', '.join(ORACLE_SPANS)} read the gold answers: no system can pick its spans that way."]
    return "\n".join(lines) + "\n"
