"""Which questions and windows a fold trains on (train.py): the seeded question sample (checklist demo
first, optionally at a set share of unanswerable questions), repeated sources, and the answer-less
windows dropped from training. Held-out and out-of-fold questions are never repeated or dropped.
"""
from __future__ import annotations

import logging
import random

log = logging.getLogger("mrc.train")


def select_questions(df, max_questions, seed, unanswerable_share=None):
    """Every DuReader-checklist demo question (the target task), then a seeded random sample of the rest;
    with `unanswerable_share`, the sample is drawn so that this share of all picked questions is
    unanswerable (DuReader-checklist: about half; the training sets together: about a quarter)."""
    from mrc.data import labelled

    df = labelled(df).reset_index(drop=True)
    if not max_questions or len(df) <= max_questions:
        if unanswerable_share is None:
            return df
        max_questions = len(df)
    rng = random.Random(seed)
    target = df.index[df["source"] == "checklist_demo"].tolist()[:max_questions]
    rest = [i for i in df.index if df.at[i, "source"] != "checklist_demo"]
    n_rest = max_questions - len(target)
    if unanswerable_share is None:
        picked = target + rng.sample(rest, n_rest)
    else:
        impossible = df["is_impossible"].astype(bool)
        pools = [[i for i in rest if impossible[i]], [i for i in rest if not impossible[i]]]
        target_u = int(impossible[target].sum())
        total_u = min(round(unanswerable_share * max_questions), len(pools[0]) + target_u)
        # too few unanswerable questions for the share: fewer answerable ones too, so the share holds
        total = max_questions if unanswerable_share == 0 else min(max_questions, round(total_u / unanswerable_share))
        n_unanswerable = min(max(0, total_u - target_u), n_rest)
        n_answerable = min(max(0, total - len(target) - n_unanswerable), len(pools[1]))
        picked = target + rng.sample(pools[0], n_unanswerable) + rng.sample(pools[1], n_answerable)
    return df.loc[sorted(picked)].reset_index(drop=True)


def repeat_sources(df, repeats: dict):
    """The fold's training questions with those of the given sources repeated (source -> times): the
    target task's own 100 demo questions are the only ones with its long, early answers. Held-out and
    out-of-fold questions are never repeated."""
    import pandas as pd

    extra = [df[df["source"] == source] for source, times in repeats.items() for _ in range(int(times) - 1)]
    return pd.concat([df, *extra], ignore_index=True) if extra else df


def keep_negative_windows(features, share: float, seed: int):
    """Training windows: every window that holds its answer, every unanswerable question's first window,
    and a seeded `share` of the other answer-less windows. Long passages (CAIL, CMRC, DRCD) give 2-4
    windows a question, most of them pointing at [CLS]; the span head learns from the answer windows,
    so on a CPU budget these are worth more steps. share=1 keeps everything."""
    if share >= 1.0:
        return features
    rng = random.Random(seed)
    answerable_questions = {q for q, a in zip(features.example_id, features.answerable) if a}
    keep, seen = [], set()
    for i, (qid, row, has_answer) in enumerate(zip(features.example_id, features.example_index, features.answerable)):
        first = row not in seen  # by table row: a repeated question (repeat_sources) keeps one window per copy
        seen.add(row)
        if has_answer or (first and qid not in answerable_questions) or rng.random() < share:
            keep.append(i)
    log.info("training windows: kept %d of %d (every answer window, unanswerable questions' first, %.0f%% of the "
             "other answer-less ones)", len(keep), len(features), 100 * share)
    return features.subset(keep)


def cap(df, n, seed):
    if not n or len(df) <= n:
        return df
    return df.loc[sorted(random.Random(seed).sample(list(df.index), n))].reset_index(drop=True)
