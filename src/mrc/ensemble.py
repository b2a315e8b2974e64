"""Ensembling in plain numpy: fuse members' logits, then ONE post-processing and ONE no-answer decision.

A member is one experiment (outputs/<exp>/), its fold models' logits files in the npz contract of
mrc.postprocess. Three fusions, each ending in the per-example score records of
`postprocess.example_scores` ({"text", "score", "start", "null_score", "p_answerable"}), so the
no-answer decision is always `postprocess.decide` and its tuning `postprocess.tune_threshold`:

- "logits" (members with equal feature_key: same tokenizer, max_len, stride, title): weighted mean of
  start/end logits and of P(answerable) per feature (`weighted_logits`), then `example_scores`.
- "char" (different tokenizers): each member's per-window start/end log-softmax is mapped onto passage
  characters (a token's start score onto its first character, its end score onto its last; max over
  windows), the probabilities are averaged with the weights, and the fused character scores are
  written as a logits dict whose "tokens" are the passage characters (`char_logits`): the same
  `example_scores` picks the span. Null score: weighted mean of the members' log P([CLS] start, [CLS] end).
- "nbest" (different tokenizers): each member's n-best spans (all windows, HF utils_qa style softmax
  over the candidates and the null answer) become answer-string probabilities; the weighted sum per
  string picks the answer; score = log P(string), null_score = log P(null).

Members with different feature keys are first grouped by key; a group is fused with "logits" and
counts as one member (weight = its members' sum) in "char" / "nbest". "auto" = "logits" when every
key is equal, else "char".

Weights and the no-answer threshold are tuned together on out-of-fold predictions only
(`tune_on_oof`): fold k of every member was trained without the same questions, so fold k's OOF
logits of the members are fused, scored, and the folds' scores joined.
"""
from __future__ import annotations

import itertools
import math
from collections import OrderedDict

import numpy as np

from . import postprocess
from .errors import MRCError

FUSIONS = ("auto", "logits", "char", "nbest")
_TINY = 1e-30


# ---------------------------------------------------------------- weights
def normalize_weights(weights, n: int, names=None) -> list[float]:
    """Non-negative weights, one per member, scaled to sum 1 (None: equal)."""
    if weights is None:
        return [1.0 / n] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise MRCError(f"--weights: {len(weights)} weights for {n} members ({', '.join(names or [])})")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise MRCError(f"--weights {weights}: weights must be non-negative numbers, not all zero")
    total = sum(weights)
    return [w / total for w in weights]


def weight_grid(n: int, step: float) -> list[tuple]:
    """Every weight vector on the simplex with components multiple of `step` (equal weights first)."""
    if n == 1:
        return [(1.0,)]
    if not 0 < step <= 1:
        raise MRCError(f"--weight_step must be in (0, 1], got {step}")
    units = max(1, round(1 / step))
    grid = [tuple(c / units for c in combo) for combo in itertools.product(range(units + 1), repeat=n)
            if sum(combo) == units]
    equal = tuple([1.0 / n] * n)
    return [equal] + [g for g in grid if not np.allclose(g, equal)]


# ---------------------------------------------------------------- same feature key: logits
def weighted_logits(members: list[dict], weights=None, names=None) -> dict:
    """Weighted mean of logits files that line up (checked by postprocess.average_logits): start/end
    logits and answerable logits averaged, p_answerable = weighted mean of the members' probabilities."""
    postprocess.average_logits(members, names)  # raises a clear MRCError when keys / ids / shapes differ
    w = np.asarray(normalize_weights(weights, len(members), names), dtype=np.float64)
    mean = lambda key: np.tensordot(w, np.stack([m[key].astype(np.float64) for m in members]), axes=1)  # noqa: E731
    first = members[0]
    out = postprocess.make_logits(first["example_id"], mean("start_logits"), mean("end_logits"), first["offsets"],
                                  mean("answerable_logits"), first["feature_key"])
    out["p_answerable"] = mean("p_answerable").astype(np.float32)
    return out


def _group_by_key(logits: list[dict], weights: list[float], names: list[str]):
    """[(fused logits of one feature key, summed weight)], in first-seen key order."""
    groups = OrderedDict()
    for lg, w, name in zip(logits, weights, names):
        groups.setdefault(str(lg["feature_key"]), []).append((lg, w, name))
    out = []
    for items in groups.values():
        total = sum(w for _, w, _ in items)
        if total <= 0:
            continue  # every member of this tokenizer has weight 0
        inner = [w / total for _, w, _ in items]
        fused = items[0][0] if len(items) == 1 else weighted_logits([i[0] for i in items], inner, [i[2] for i in items])
        out.append((fused, total))
    return out


# ---------------------------------------------------------------- different tokenizers: characters
def _log_softmax(row: np.ndarray) -> np.ndarray:
    """log-softmax over the real (non-padding) positions; padding stays -inf."""
    valid = row > postprocess.PAD_LOGIT / 2
    out = np.full(row.shape, -np.inf)
    x = row[valid].astype(np.float64)
    out[valid] = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    return out


def char_probs(logits: dict, contexts: dict) -> dict:
    """id -> (P(start at char), P(end at char), null log-prob, P(answerable)) of one member.

    Per window: softmax over its tokens; a token's start probability lands on its first character,
    its end probability on its last; a character seen by several windows keeps the max (as
    example_scores keeps the best window). Null: min over windows of log P(start=[CLS]) + log P(end=[CLS])."""
    out = {}
    for f, eid in enumerate(logits["example_id"]):
        eid = str(eid)
        if eid not in contexts:
            raise MRCError(f"id {eid}: logits for an example that is not in the input")
        n = len(contexts[eid])
        if eid not in out:
            out[eid] = [np.zeros(n), np.zeros(n), np.inf, 0.0]
        rec = out[eid]
        ls, le = _log_softmax(logits["start_logits"][f]), _log_softmax(logits["end_logits"][f])
        off = logits["offsets"][f]
        tok = (off[:, 0] >= 0) & (off[:, 1] > off[:, 0]) & (off[:, 1] <= n) & np.isfinite(ls) & np.isfinite(le)
        np.maximum.at(rec[0], off[tok, 0], np.exp(ls[tok]))
        np.maximum.at(rec[1], off[tok, 1] - 1, np.exp(le[tok]))
        rec[2] = min(rec[2], float(ls[0] + le[0]))
        rec[3] = max(rec[3], float(logits["p_answerable"][f]))
    return out


def char_logits(members: list[dict], weights: list[float]) -> dict:
    """Fuse members' char_probs into a logits dict (npz contract) with one feature per example whose
    tokens are [CLS] + the passage characters: start/end 'logits' = log of the weighted mean
    probabilities, [CLS] = half the weighted null log-prob each (so start[0] + end[0] is the null score)."""
    ids = list(OrderedDict.fromkeys(eid for m in members for eid in m))
    for m in members:
        if len(m) != len(ids):
            missing = next(i for i in ids if i not in m)
            raise MRCError(f"id {missing}: not predicted by every ensemble member")
    width = 1 + max((len(members[0][i][0]) for i in ids), default=0)
    n = len(ids)
    start = np.full((n, width), postprocess.PAD_LOGIT, dtype=np.float32)
    end = np.full((n, width), postprocess.PAD_LOGIT, dtype=np.float32)
    offsets = np.full((n, width, 2), -1, dtype=np.int32)
    p_answerable = np.zeros(n)
    for row, eid in enumerate(ids):
        length = len(members[0][eid][0])
        ps = sum(w * m[eid][0] for m, w in zip(members, weights))
        pe = sum(w * m[eid][1] for m, w in zip(members, weights))
        null = sum(w * m[eid][2] for m, w in zip(members, weights))
        start[row, 0] = end[row, 0] = null / 2
        start[row, 1: 1 + length] = np.log(ps + _TINY)
        end[row, 1: 1 + length] = np.log(pe + _TINY)
        offsets[row, 1: 1 + length, 0] = np.arange(length)
        offsets[row, 1: 1 + length, 1] = np.arange(1, length + 1)
        p_answerable[row] = sum(w * m[eid][3] for m, w in zip(members, weights))
    p = np.clip(p_answerable, 1e-7, 1 - 1e-7)
    answerable_logits = np.stack([np.zeros(n), np.log(p / (1 - p))], axis=1)
    out = postprocess.make_logits(np.array(ids, dtype=str), start, end, offsets, answerable_logits, "char-level fusion")
    out["p_answerable"] = p_answerable.astype(np.float32)
    return out


# ---------------------------------------------------------------- different tokenizers: n-best strings
def nbest_strings(logits: dict, contexts: dict, n_best=20, max_answer_tokens=64, max_answer_chars=None) -> dict:
    """id -> {"probs": {answer text: P}, "start": {text: first char start}, "null": P(null), "p_answerable"}.

    Candidates: the n_best best valid pairs among the n_best x n_best start/end pairs of every window
    (the validity rules of postprocess.best_span), each span keeping its best window score; null
    score = min over windows of start[CLS] + end[CLS]; one softmax over the spans and the null answer (HF utils_qa), then the
    probabilities of spans with the same text are summed; the n_best most probable strings are kept."""
    raw = OrderedDict()  # id -> {"spans": {(s, e): score}, "null": float, "p": float}
    for f, eid in enumerate(logits["example_id"]):
        eid = str(eid)
        if eid not in contexts:
            raise MRCError(f"id {eid}: logits for an example that is not in the input")
        rec = raw.setdefault(eid, {"spans": {}, "null": np.inf, "p": 0.0})
        start, end, off = logits["start_logits"][f], logits["end_logits"][f], logits["offsets"][f]
        rec["null"] = min(rec["null"], float(start[0] + end[0]))
        rec["p"] = max(rec["p"], float(logits["p_answerable"][f]))
        passage = off[:, 0] >= 0
        if not passage.any():
            continue
        k = min(n_best, int(passage.sum()))
        s_idx = np.argsort(-np.where(passage, start, -np.inf), kind="stable")[:k]
        e_idx = np.argsort(-np.where(passage, end, -np.inf), kind="stable")[:k]
        total = start[s_idx][:, None].astype(np.float64) + end[e_idx][None, :]
        length = e_idx[None, :] - s_idx[:, None]
        valid = (length >= 0) & (length < max_answer_tokens)
        if max_answer_chars is not None:
            valid &= (off[e_idx, 1][None, :] - off[s_idx, 0][:, None]) <= max_answer_chars
        flat = np.flatnonzero(valid)
        flat = flat[np.argsort(-total.ravel()[flat], kind="stable")[:n_best]]  # this window's n-best pairs
        for i, j in zip(*np.unravel_index(flat, total.shape)):
            cs, ce, score = int(off[s_idx[i], 0]), int(off[e_idx[j], 1]), float(total[i, j])
            if score > rec["spans"].get((cs, ce), -np.inf):
                rec["spans"][(cs, ce)] = score
    out = OrderedDict()
    for eid, rec in raw.items():
        spans = [(s, e, sc) for (s, e), sc in rec["spans"].items() if contexts[eid][s:e]]
        scores = np.array([sc for _, _, sc in spans] + [rec["null"]], dtype=np.float64)
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        texts, starts = {}, {}
        for (s, e, _), p in zip(spans, probs[:-1]):
            text = contexts[eid][s:e]
            texts[text] = texts.get(text, 0.0) + float(p)
            starts[text] = min(starts.get(text, s), s)
        keep = sorted(texts, key=lambda t: (-texts[t], starts[t]))[:n_best]  # the n-best strings (HF utils_qa)
        out[eid] = {"probs": {t: texts[t] for t in keep}, "start": {t: starts[t] for t in keep}, "null": float(probs[-1]),
                    "p_answerable": rec["p"]}
    return out


def fuse_nbest(members: list[dict], weights: list[float]) -> dict:
    """Weighted sum of the members' answer-string probabilities -> example_scores-style records."""
    ids = list(OrderedDict.fromkeys(eid for m in members for eid in m))
    out = {}
    for eid in ids:
        if any(eid not in m for m in members):
            raise MRCError(f"id {eid}: not predicted by every ensemble member")
        probs, starts = {}, {}
        for m, w in zip(members, weights):
            for text, p in m[eid]["probs"].items():
                probs[text] = probs.get(text, 0.0) + w * p
                starts[text] = min(starts.get(text, m[eid]["start"][text]), m[eid]["start"][text])
        null = sum(w * m[eid]["null"] for m, w in zip(members, weights))
        p_answerable = sum(w * m[eid]["p_answerable"] for m, w in zip(members, weights))
        rec = {"text": "", "score": -np.inf, "start": -1, "null_score": math.log(null + _TINY), "p_answerable": p_answerable}
        if probs:
            text = max(probs, key=lambda t: (probs[t], -starts[t]))  # ties: the earlier span
            rec.update(text=text, score=math.log(probs[text] + _TINY), start=starts[text])
        out[eid] = rec
    return out


# ---------------------------------------------------------------- one entry point
def resolve_fusion(fusion: str, logits: list[dict]) -> str:
    if fusion not in FUSIONS:
        raise MRCError(f"unknown fusion {fusion!r} (choose from {', '.join(FUSIONS)})")
    keys = {str(lg["feature_key"]) for lg in logits}
    if fusion == "auto":
        return "logits" if len(keys) == 1 else "char"
    if fusion == "logits" and len(keys) > 1:
        raise MRCError("fusion 'logits' needs members with the same tokenizer and feature settings "
                       f"(feature keys: {', '.join(sorted(keys))}); use --fusion char or nbest")
    return fusion


def _cached(cache, kind, lg, compute):
    """Weight-independent per-member work (char_probs / nbest_strings), reused across the weight grid.
    The cache keeps a reference to the logits dict, so its id cannot be reused by another object."""
    if cache is None:
        return compute()
    hit = cache.get((kind, id(lg)))
    if hit is None or hit[0] is not lg:
        hit = cache[(kind, id(lg))] = (lg, compute())
    return hit[1]


def fuse_scores(logits: list[dict], weights, contexts: dict, post: dict, fusion="auto", names=None, cache=None) -> dict:
    """Members' logits (each already averaged over its folds) -> id -> score record of example_scores.
    `cache`: a dict kept by the caller across calls on the same logits (the OOF weight search)."""
    names = names or [f"member {i}" for i in range(len(logits))]
    weights = normalize_weights(weights, len(logits), names)
    fusion = resolve_fusion(fusion, logits)
    n_best, max_tokens, max_chars = post["n_best"], post["max_answer_tokens"], post.get("max_answer_chars")
    groups = _group_by_key(logits, weights, names)
    if fusion == "logits":
        return postprocess.example_scores(groups[0][0], contexts, n_best, max_tokens, max_chars)
    group_logits, group_weights = [g[0] for g in groups], [g[1] for g in groups]
    if fusion == "char":
        fused = char_logits([_cached(cache, "char", lg, lambda lg=lg: char_probs(lg, contexts)) for lg in group_logits],
                            group_weights)
        # one "token" per character here: the answer-length cap is in characters
        char_cap = max_chars or 2 * max_tokens
        return postprocess.example_scores(fused, contexts, n_best, char_cap + 1, char_cap)
    members = [_cached(cache, "nbest", lg, lambda lg=lg: nbest_strings(lg, contexts, n_best, max_tokens, max_chars))
               for lg in group_logits]
    return fuse_nbest(members, group_weights)


def fold_average(fold_logits: list[dict], names=None) -> dict:
    """A member's prediction on a test input: its fold models' logits, equally weighted."""
    return fold_logits[0] if len(fold_logits) == 1 else weighted_logits(fold_logits, None, names)


def oof_scores(members_folds: list[list[dict]], weights, contexts: dict, post: dict, fusion="auto", names=None,
               cache=None) -> dict:
    """members_folds[m][k]: member m's out-of-fold logits of fold k. Fold by fold fusion, joined."""
    scores = {}
    for k in range(len(members_folds[0])):
        scores.update(fuse_scores([m[k] for m in members_folds], weights, contexts, post, fusion, names, cache))
    return scores


def tune_on_oof(members_folds, gold: dict, contexts: dict, post: dict, fusion="auto", modes=postprocess.MODEL_MODES,
                weights=None, weight_step=0.25, names=None, metric=None, log=None, hand=None, seed=42,
                target_unanswerable_share=None) -> dict:
    """Weights (grid on the simplex unless given) and no-answer mode/threshold maximising the official
    F1 of the fused out-of-fold predictions. Returns {"weights", "mode", "threshold", "F1", "EM",
    "answered", "total", "grid": [(weights, F1), ...], "stacker": parameters or None, "scores": the fused
    OOF scores of the chosen weights}. Only OOF data goes
    in: the test input cannot change the result. Mode "stack" fits mrc.answerability's stacker on each
    candidate's fused OOF scores (`hand`: the OOF questions' hand_feature_table). With
    `target_unanswerable_share` the objective is the label-shift weighted F1 (postprocess.tune_threshold)."""
    from . import answerability

    if "stack" in modes and hand is None:
        raise MRCError("no-answer mode 'stack' needs the out-of-fold questions' features (hand=)")
    n = len(members_folds)
    if weights is not None:
        candidates = [tuple(normalize_weights(weights, n, names))]
    else:
        candidates = weight_grid(n, weight_step)
    best, grid, cache = None, [], {}
    for cand in candidates:
        scores = oof_scores(members_folds, cand, contexts, post, fusion, names, cache)
        stacker = answerability.fit_stacker(scores, hand, gold, seed) if "stack" in modes else None
        tuned = postprocess.tune_threshold(scores, gold, [m for m in modes if m != "stack" or stacker is not None], metric,
                                           target_unanswerable_share)
        tuned["stacker"] = stacker
        objective = tuned.get("weighted_F1", tuned["F1"])
        grid.append((list(cand), objective))
        if log:
            log.info("weights %s: OOF F1 %.3f%s (%s >= %.4g)", [round(c, 3) for c in cand], tuned["F1"],
                     f", label-shift weighted {objective:.3f}" if "weighted_F1" in tuned else "", tuned["mode"], tuned["threshold"])
        if best is None or objective > best[2] + 1e-9:  # ties keep the earlier (equal weights first)
            best = (cand, {**tuned, "scores": scores}, objective)
    cand, tuned, _ = best
    return {"weights": list(cand), **tuned, "grid": grid}


def check_aligned(names: list[str], fold_ids: list[list[np.ndarray]]):
    """Members must hold out the same questions in the same folds (one folds file), else MRCError."""
    def assignment(folds):
        out = {}
        for k, ids in enumerate(folds):
            for i in dict.fromkeys(str(x) for x in ids):
                out[i] = k
        return out

    ref = assignment(fold_ids[0])
    for name, folds in zip(names[1:], fold_ids[1:]):
        if len(folds) != len(fold_ids[0]):
            raise MRCError(f"{name}: {len(folds)} folds, {names[0]} has {len(fold_ids[0])}; ensemble members need the same folds")
        other = assignment(folds)
        if set(other) != set(ref):
            only = sorted(set(other) ^ set(ref))[:1]
            raise MRCError(f"{name}: out-of-fold ids differ from {names[0]} ({len(other)} vs {len(ref)} questions, "
                           f"e.g. id {only[0]}); ensemble members must be trained on the same questions and folds file")
        moved = next((i for i in ref if ref[i] != other[i]), None)
        if moved is not None:
            raise MRCError(f"{name}: fold assignment differs from {names[0]} (id {moved}: fold {other[moved]} vs "
                           f"{ref[moved]}); ensemble members must share one folds file")
