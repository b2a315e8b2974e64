"""Logits -> answers, in plain numpy (HF utils_qa style), and THE no-answer decision.

Per-feature logits file (npz, written atomically with mrc.io_utils.atomic_save_npz) -- the contract
between fine-tuning (outputs/<exp>/fold<k>/oof.npz, dev.npz), prediction and the ensemble stage:

    example_id         (F,)        str      id of the example each feature (window) belongs to, as in
                                            the table the features were built from: '<source>:<id>'
                                            in oof.npz / dev.npz (mrc.data.load_sources), the file's
                                            own ids from `predict --logits_out` (mrc.data.load_file)
    start_logits       (F, L)      float32  per-token start logits, padded with PAD_LOGIT (-1e4)
    end_logits         (F, L)      float32  per-token end logits, padded with PAD_LOGIT
    offsets            (F, L, 2)   int32    character span of each token in the passage; -1 for
                                            [CLS], question, title, [SEP] and padding
    answerable_logits  (F, 2)      float32  classifier logits on [CLS]: [unanswerable, answerable]
    p_answerable       (F,)        float32  softmax(answerable_logits)[:, 1]
    feature_key        ()          str      mrc.features.feature_key(tokenizer, max_len, stride,
                                            use_title): files line up only when keys are equal

Features of one example are consecutive, in the order mrc.features.build_features makes them, so two
files with the same feature_key and the same example_id array can be averaged element-wise
(`average_logits`).

Per example (`example_scores`): best span text and its score (start + end logit, max over windows
and the n-best start/end pairs), its character start, the null score (start[CLS] + end[CLS], min over
windows, SQuAD 2.0 style) and P(answerable) (max over windows).

The no-answer decision is `decide(scores, threshold, mode)`, the one function used by CV, prediction
and ensembling. Modes:
    "prob": answer when P(answerable) >= threshold
    "null": answer when best span score - null score >= threshold (SQuAD 2.0 null-score difference)
    "stack": answer when rec["p_stack"] >= threshold (mrc.answerability: a logistic regression over the
            model's scores and question/title/passage overlap, fitted on out-of-fold predictions)
`tune_threshold` picks mode and threshold that maximise the official F1 on out-of-fold predictions.
"""
from __future__ import annotations

import numpy as np

from .errors import MRCError

PAD_LOGIT = -1e4
NO_ANSWER = "no answer"
MODES = ("prob", "null", "stack")
MODEL_MODES = ("prob", "null")  # the modes that need nothing but the model's logits
NPZ_KEYS = ("example_id", "start_logits", "end_logits", "offsets", "answerable_logits", "p_answerable", "feature_key")


def softmax(x: np.ndarray, axis=-1) -> np.ndarray:
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def pad_logits(rows, width: int | None = None, fill=PAD_LOGIT) -> np.ndarray:
    """Ragged list of 1-D arrays -> (n, width) float32."""
    width = width or max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), fill, dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def make_logits(example_id, start_logits, end_logits, offsets, answerable_logits, feature_key: str) -> dict:
    """Assemble the npz dict (arrays already padded to a common width L)."""
    answerable_logits = np.asarray(answerable_logits, dtype=np.float32)
    out = {
        "example_id": np.asarray(example_id, dtype=str),
        "start_logits": np.asarray(start_logits, dtype=np.float32),
        "end_logits": np.asarray(end_logits, dtype=np.float32),
        "offsets": np.asarray(offsets, dtype=np.int32),
        "answerable_logits": answerable_logits,
        "p_answerable": softmax(answerable_logits)[:, 1].astype(np.float32),
        "feature_key": np.asarray(feature_key),
    }
    n = len(out["example_id"])
    if not (out["start_logits"].shape == out["end_logits"].shape == out["offsets"].shape[:2]
            and out["start_logits"].shape[0] == n and out["answerable_logits"].shape == (n, 2)):
        raise MRCError("logits arrays do not line up: " + ", ".join(f"{k} {v.shape}" for k, v in out.items()))
    return out


def save_logits(path, logits: dict):
    from .io_utils import atomic_save_npz

    atomic_save_npz(path, **{k: logits[k] for k in NPZ_KEYS})


def load_logits(path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in NPZ_KEYS if k not in data.files]
            if missing:
                raise MRCError(f"{path}: not a logits file (missing {', '.join(missing)})")
            out = {k: data[k] for k in NPZ_KEYS}
    except FileNotFoundError:
        raise MRCError(f"{path}: file not found") from None
    except (OSError, ValueError) as err:
        raise MRCError(f"{path}: unreadable npz ({err})") from None
    out["feature_key"] = str(out["feature_key"])
    return out


def average_logits(members: list[dict], names=None) -> dict:
    """Element-wise mean of logits files that line up (same feature_key and example_id order)."""
    if not members:
        raise MRCError("no logits to average")
    names = names or [f"member {i}" for i in range(len(members))]
    first = members[0]
    for name, m in zip(names[1:], members[1:]):
        if m["feature_key"] != first["feature_key"]:
            raise MRCError(f"{name}: feature_key {m['feature_key']} differs from {first['feature_key']} ({names[0]})")
        if m["example_id"].shape != first["example_id"].shape or not np.array_equal(m["example_id"], first["example_id"]):
            raise MRCError(f"{name}: features do not line up with {names[0]} (different example ids)")
        if m["start_logits"].shape != first["start_logits"].shape:
            raise MRCError(f"{name}: logits shape {m['start_logits'].shape} differs from {first['start_logits'].shape}")
    mean = lambda k: np.mean([m[k] for m in members], axis=0)  # noqa: E731
    return make_logits(first["example_id"], mean("start_logits"), mean("end_logits"), first["offsets"],
                       mean("answerable_logits"), first["feature_key"])


def best_span(start, end, offsets, n_best=20, max_answer_tokens=64, max_answer_chars=None):
    """Best (score, char_start, char_end) over passage tokens of one feature, or None."""
    passage = offsets[:, 0] >= 0
    if not passage.any():
        return None
    s_scores = np.where(passage, start, -np.inf)
    e_scores = np.where(passage, end, -np.inf)
    k = min(n_best, int(passage.sum()))
    s_idx = np.argsort(-s_scores, kind="stable")[:k]
    e_idx = np.argsort(-e_scores, kind="stable")[:k]
    total = s_scores[s_idx][:, None] + e_scores[e_idx][None, :]
    length = e_idx[None, :] - s_idx[:, None]
    valid = (length >= 0) & (length < max_answer_tokens)
    if max_answer_chars is not None:
        chars = offsets[e_idx, 1][None, :] - offsets[s_idx, 0][:, None]
        valid &= chars <= max_answer_chars
    if not valid.any():
        return None
    total = np.where(valid, total, -np.inf)
    i, j = np.unravel_index(int(np.argmax(total)), total.shape)
    return float(total[i, j]), int(offsets[s_idx[i], 0]), int(offsets[e_idx[j], 1])


def example_scores(logits: dict, contexts: dict, n_best=20, max_answer_tokens=64, max_answer_chars=None) -> dict:
    """id -> {"text", "score", "start", "null_score", "p_answerable"} (see module docstring).
    `contexts`: id -> passage text (the one the offsets point into)."""
    out = {}
    ids = logits["example_id"]
    for f in range(len(ids)):
        eid = str(ids[f])
        if eid not in contexts:
            raise MRCError(f"id {eid}: logits for an example that is not in the input")
        rec = out.setdefault(eid, {"text": "", "score": -np.inf, "start": -1, "null_score": np.inf, "p_answerable": 0.0})
        start, end = logits["start_logits"][f], logits["end_logits"][f]
        rec["null_score"] = min(rec["null_score"], float(start[0] + end[0]))
        rec["p_answerable"] = max(rec["p_answerable"], float(logits["p_answerable"][f]))
        span = best_span(start, end, logits["offsets"][f], n_best, max_answer_tokens, max_answer_chars)
        if span is not None and span[0] > rec["score"]:
            rec["score"], rec["start"] = span[0], span[1]
            rec["text"] = contexts[eid][span[1]: span[2]]
    return out


# Answer units for `expand_answers`: where a sentence / clause of a Chinese passage ends.
SENTENCE_ENDS = frozenset("。！？!?\n")
CLAUSE_ENDS = SENTENCE_ENDS | frozenset("，；,;")
EXPAND_UNITS = {"clause": CLAUSE_ENDS, "sentence": SENTENCE_ENDS}


def expand_span(context: str, start: int, end: int, unit: str) -> tuple[int, int]:
    """[start, end) grown to the enclosing clause or sentence of `context` (the end keeps its punctuation
    mark out, as DuReader-checklist's answers mostly do)."""
    stops = EXPAND_UNITS[unit]
    while start > 0 and context[start - 1] not in stops:
        start -= 1
    if end > start and context[end - 1] in stops:  # the span already ends its sentence
        return start, end
    while end < len(context) and context[end] not in stops:
        end += 1
    return start, end


def check_expand_to(unit: str | None, where: str = "post") -> None:
    """The one check of a post `expand_to` value (config reading and expand_answers)."""
    if unit is not None and unit not in EXPAND_UNITS:
        raise MRCError(f"{where} expand_to {unit!r}: choose from {', '.join(EXPAND_UNITS)} or null")


def expand_answers(scores: dict, contexts: dict, unit: str | None) -> dict:
    """Every best span grown to its enclosing clause or sentence (post `expand_to`; None leaves them).

    Why: DuReader-checklist's answers are whole clauses and sentences far more often than the training
    sets' (answers starting a sentence: checklist demo 43%, dev_public 36%; robust 11%, CMRC 7%, SQuAD-zh
    12%), and a from-scratch model finds the right region before it finds the right boundaries. Applied to
    predictions for the target task only, never to the out-of-fold questions of the training mix."""
    check_expand_to(unit)
    if unit is None:
        return scores
    out = {}
    for eid, rec in scores.items():
        rec = dict(rec)
        if rec["text"]:
            context = contexts[eid]
            start, end = expand_span(context, rec["start"], rec["start"] + len(rec["text"]), unit)
            rec["start"], rec["text"] = start, context[start:end]
        out[eid] = rec
    return out


def decision_value(rec: dict, mode: str) -> float:
    """The number the threshold is compared with: higher means 'answer it'."""
    if mode == "prob":
        return rec["p_answerable"]
    if mode == "null":
        return rec["score"] - rec["null_score"] if rec["text"] else -np.inf
    if mode == "stack":
        if "p_stack" not in rec:
            raise MRCError("no-answer mode 'stack' needs the stacker's P(answerable) (mrc.answerability.apply_stacker)")
        return rec["p_stack"] if rec["text"] else -np.inf
    raise MRCError(f"unknown no-answer mode {mode!r} (choose from {', '.join(MODES)})")


def decide(scores: dict, threshold: float, mode: str) -> dict:
    """THE no-answer decision: id -> best span text, or 'no answer'."""
    out = {}
    for eid, rec in scores.items():
        answer = rec["text"] and decision_value(rec, mode) >= threshold
        out[eid] = rec["text"] if answer else NO_ANSWER
    return out


def tune_threshold(scores: dict, gold: dict, modes=MODEL_MODES, metric=None, target_unanswerable_share=None) -> dict:
    """Mode and threshold maximising the official F1 over the ids of `gold` (out-of-fold predictions).

    Each example's F1 is computed by the official metric (metric.score_one) twice, once answered with its best span and
    once with 'no answer'; a threshold answers exactly the examples whose decision value reaches it,
    so the total F1 of every threshold is a cumulative sum. The winner is re-checked with the full
    official evaluation. Returns {"mode", "threshold", "F1", "EM", "answered", "total"}.

    `target_unanswerable_share` (label shift): the out-of-fold questions are weighted so that unanswerable ones make
    up that share (the target task's, e.g. ~0.52 for DuReader-checklist against ~0.27 in the training mix) before
    the threshold is chosen: what answering costs depends on how often the answer is `no answer`. "F1"/"EM" stay
    the plain out-of-fold scores; "weighted_F1" is the objective that was maximised.
    """
    if metric is None:
        from . import metric
    ids = [i for i in gold if i in scores]
    if len(ids) != len(gold):
        missing = [i for i in gold if i not in scores][:3]
        raise MRCError(f"threshold tuning: no scores for {len(gold) - len(ids)} gold ids (e.g. {missing})")
    weights = label_shift_weights([bool(gold[i]["is_impossible"]) for i in ids], target_unanswerable_share)
    f1_answer = np.array([_single_f1(metric, gold[i], scores[i]["text"] or NO_ANSWER) for i in ids])
    f1_null = np.array([_single_f1(metric, gold[i], NO_ANSWER) for i in ids])
    best = None
    for mode in modes:
        values = np.array([decision_value(scores[i], mode) for i in ids], dtype=np.float64)
        order = np.argsort(-values, kind="stable")
        v, gain = values[order], (weights * (f1_answer - f1_null))[order]
        # answering the top-k examples: total = sum(null) + cumsum(gain)[k-1]
        totals = np.concatenate([[0.0], np.cumsum(gain)])
        # cut only between distinct values: ties are decided together
        n = len(v)
        cut_ok = np.ones(n + 1, dtype=bool)
        cut_ok[1:n] = v[:-1] != v[1:]
        k = int(np.argmax(np.where(cut_ok, totals, -np.inf)))
        if k == 0:  # answer nothing
            threshold = float(v[0]) + 1.0 if n and np.isfinite(v[0]) else 1e30
        elif k == n or not np.isfinite(v[k]):  # answer everything that has a span
            threshold = float(v[k - 1]) if np.isfinite(v[k - 1]) else -1e30
        else:
            threshold = float((v[k - 1] + v[k]) / 2)
        total = float(totals[k])
        if best is None or total > best[0] + 1e-9:
            best = (total, mode, threshold)
    _, mode, threshold = best
    predictions = decide({i: scores[i] for i in ids}, threshold, mode)
    result = metric.evaluate(gold, predictions)
    out = {"mode": mode, "threshold": threshold, "F1": result["F1"], "EM": result["EM"],
           "answered": int(sum(p != NO_ANSWER for p in predictions.values())), "total": len(ids)}
    if target_unanswerable_share is not None:
        out["target_unanswerable_share"] = float(target_unanswerable_share)
        out["weighted_F1"] = round(100.0 * float(weights @ f1_null + best[0]) / float(weights.sum()), 3)
    return out


def label_shift_weights(unanswerable, target_share=None) -> np.ndarray:
    """Per-question weights giving the unanswerable questions `target_share` of the total weight (all 1 when None,
    or when one class is absent)."""
    unanswerable = np.asarray(unanswerable, dtype=bool)
    weights = np.ones(len(unanswerable))
    if target_share is None:
        return weights
    if not 0 < float(target_share) < 1:
        raise MRCError(f"target_unanswerable_share {target_share}: must be strictly between 0 and 1")
    share = unanswerable.mean() if len(unanswerable) else 0.0
    if 0 < share < 1:
        weights[unanswerable] = float(target_share) / share
        weights[~unanswerable] = (1 - float(target_share)) / (1 - share)
    return weights


def _single_f1(metric, gold_rec: dict, prediction: str) -> float:
    return float(metric.score_one(prediction, gold_rec)[0])


def rank_auc(values, labels) -> float | None:
    """ROC AUC of `values` for binary `labels` (scikit-learn); None when one class is absent."""
    from sklearn.metrics import roc_auc_score

    values, labels = np.asarray(values, dtype=np.float64), np.asarray(labels, dtype=bool)
    if labels.all() or not labels.any():
        return None
    return float(roc_auc_score(labels, np.nan_to_num(values, nan=-1e30, posinf=1e30, neginf=-1e30)))


def diagnostics(scores: dict, gold: dict, metric=None) -> dict:
    """What the decision threshold hides: the span quality (official F1 of the best span on the answerable
    questions, as if every one were answered) and how well each decision value ranks answerable above
    unanswerable (ROC AUC)."""
    if metric is None:
        from . import metric
    ids = [i for i in gold if i in scores]
    answerable = np.array([not gold[i]["is_impossible"] for i in ids], dtype=bool)
    span_f1 = [_single_f1(metric, gold[i], scores[i]["text"] or NO_ANSWER) for i, a in zip(ids, answerable) if a]
    out = {"answerable_span_F1": round(100.0 * float(np.mean(span_f1)), 3) if span_f1 else None}
    for mode in MODES:
        if mode == "stack" and not all("p_stack" in scores[i] for i in ids):
            continue
        auc = rank_auc([decision_value(scores[i], mode) for i in ids], answerable)
        out[f"auc_{mode}"] = None if auc is None else round(auc, 4)
    return out
