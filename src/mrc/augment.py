"""Checklist-style unanswerable questions made from answerable ones, for training only (train --swap_negatives).

DuReader-checklist builds many of its unanswerable questions by changing one term of a question the passage
answers: "长沙社保交多少钱一个月" over a passage and title about 无锡's social insurance, "肠胃不好的老年人喝什么奶粉"
over one about babies. The training mix's unanswerable questions (translated SQuAD 2.0, CAIL) are of other
kinds, so a model trained on it ranks dev_public's answerable above unanswerable questions barely better than
chance (AUC ~0.61) while one hand count, "question words missing from the title", reaches 0.74.

`swap_negatives` copies a seeded share of the answerable questions and, in each copy, replaces one key word
that occurs in the passage or title (a noun, name, place, time... by jieba.posseg; never a question word) with a
word of the same part of speech taken from another question, one that occurs in neither the passage nor
the title. The copy keeps the passage and is labelled unanswerable: the pair teaches "the passage is about
this question's terms, not a look-alike's". Copies get the id '<id>#swap' and are added to a fold's
training questions only (never held out, never scored). An explicit random.Random(seed) drives every
choice (google-research/bert create_pretraining_data style): same seed, same questions.
"""
from __future__ import annotations

import logging
import random

import pandas as pd

log = logging.getLogger(__name__)

SWAP_SUFFIX = "#swap"
# parts of speech (jieba.posseg) of the words worth swapping: nouns, names, places, organisations, times, Latin
# words (checklist's swaps are mostly these); a look-alike of the same part of speech keeps the question grammatical.
# Verbs and adjectives are left alone: their swaps read as nonsense ("建于" -> "铲除") more often than as look-alikes.
SWAP_TAGS = frozenset({"n", "nr", "nrfg", "nrt", "ns", "nt", "nz", "nw", "vn", "t", "s", "eng"})
# words that make a question a question: replacing them changes what kind of answer is asked for, not its subject
QUESTION_WORDS = frozenset("什么 怎么 怎样 怎么样 多少 哪些 哪个 哪里 哪儿 为什么 为何 如何 是否 可以 能否 能不能 "
                           "是不是 有没有 多久 多长 多大 几个 几岁 几年 几月 几号 几点 谁 哪 吗 呢 吧 么 的 了 是 有".split())


def tag_words(question: str) -> list[tuple[int, int, str, str]]:
    """(start, end, word, tag) for the jieba.posseg words of a question (HMM off: dictionary words only, as
    for ERNIE's masking units in mrc.masking)."""
    import jieba
    import jieba.posseg as pseg

    jieba.setLogLevel(60)
    out, pos = [], 0
    for pair in pseg.cut(question, HMM=False):
        out.append((pos, pos + len(pair.word), pair.word, pair.flag))
        pos += len(pair.word)
    return out


def swappable(word: str, tag: str) -> bool:
    return len(word) >= 2 and tag in SWAP_TAGS and word not in QUESTION_WORDS and bool(word.strip())


def swap_question(question: str, title: str, passage: str, words, pools: dict, rng: random.Random, tries: int = 20):
    """The question with one key word replaced by a look-alike absent from passage and title, or None.
    `words`: tag_words(question); `pools`: tag -> list of words of that tag seen in other questions."""
    title = title if isinstance(title, str) else ""
    keys = [(s, e, w, t) for s, e, w, t in words if swappable(w, t) and (w in passage or w in title)]
    if not keys:
        return None
    s, e, word, tag = rng.choice(keys)
    pool = pools.get(tag) or []
    for _ in range(min(tries, len(pool))):
        other = rng.choice(pool)
        # the look-alike must be missing from passage and title, and not a part or extension of the word itself
        if other not in passage and other not in title and other not in word and word not in other:
            return question[:s] + other + question[e:]
    return None


def swap_negatives(df: pd.DataFrame, share: float, rng: random.Random) -> pd.DataFrame:
    """Unanswerable copies (see module docstring) of about `share` of df's answerable questions; the rows
    of mrc.data's question table, with ids '<id>#swap', empty answers, is_impossible True."""
    if share <= 0 or df.empty:
        return df.iloc[0:0].copy()
    tagged = [tag_words(str(q)) for q in df["question"]]
    pools: dict[str, list[str]] = {}
    for words in tagged:
        for _, _, w, t in words:
            if swappable(w, t):
                pools.setdefault(t, []).append(w)
    for t in pools:  # a deterministic pool order: the draws depend on the seed only
        pools[t] = sorted(set(pools[t]))
    answerable = [i for i, impossible in enumerate(df["is_impossible"].astype(bool)) if not impossible]
    picked = sorted(rng.sample(answerable, min(len(answerable), round(share * len(answerable)))))
    rows = []
    for i in picked:
        row = df.iloc[i]
        question = swap_question(str(row["question"]), row["title"], str(row["context"]), tagged[i], pools, rng)
        if question is None:
            continue
        rows.append({**row.to_dict(), "id": f"{row['id']}{SWAP_SUFFIX}", "question": question, "answers": [],
                     "is_impossible": True})
    log.info("swap negatives: %d unanswerable copies from %d picked of %d answerable questions (%d had no "
             "swappable word)", len(rows), len(picked), len(answerable), len(picked) - len(rows))
    return pd.DataFrame(rows, columns=df.columns)
