"""Masking units (characters, jieba words, ERNIE phrases/entities) and BERT's masked-LM corruption.

The masking follows google-research/bert create_pretraining_data.create_masked_lm_predictions:
candidate units in random order, up to round(len(tokens) * masked_lm_prob) (at most
max_predictions_per_seq) tokens, a unit is taken whole or not at all, each chosen token becomes
[MASK] 80% / itself 10% / a random token 10%. [CLS]/[SEP] are never candidates.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

UNIT_MODES = ("char", "word", "ernie")

# jieba.posseg tags of named entities: person (nr, nrfg, nrt), place (ns), organisation (nt), other proper noun (nz).
ENTITY_TAGS = frozenset({"nr", "nrfg", "nrt", "ns", "nt", "nz"})
# Words that may head or modify a noun phrase; a phrase must end on a noun.
NOUN_TAGS = frozenset({"n", "ng", "vn", "nr", "nrfg", "nrt", "ns", "nt", "nz"})
MODIFIER_TAGS = frozenset({"a", "an", "b", "m", "mq", "q", "f"}) | NOUN_TAGS
MAX_PHRASE_CHARS = 8
ERNIE_UNITS = "posseg-dict"  # how ernie units are found; part of the pre-training data's cache key


def _jieba():
    import jieba

    jieba.setLogLevel(60)  # jieba prints its dictionary-loading banner at INFO
    return jieba


def unit_spans(sentence: str, mode: str) -> list[tuple[int, int, str]]:
    """Character spans (start, end, kind) that are masked as one unit.

    char: every character; word: jieba words (whole-word masking, hfl/roberta-wwm-ext);
    ernie: ERNIE 1.0 knowledge masking (jieba.posseg, HMM off: ERNIE_UNITS) — named entities (kind "entity") and noun phrases
    (adjacent modifier/noun words ending on a noun, kind "phrase") as one unit, other jieba words as words.
    """
    if mode == "char":
        return [(i, i + 1, "char") for i in range(len(sentence))]
    if mode == "word":
        spans, pos = [], 0
        for word in _jieba().cut(sentence):
            spans.append((pos, pos + len(word), "word"))
            pos += len(word)
        return spans
    if mode != "ernie":
        raise ValueError(f"unknown masking unit mode {mode!r} (expected one of {UNIT_MODES})")
    import jieba.posseg as pseg

    _jieba()
    words, pos = [], 0
    # HMM off: posseg's HMM (new words + their tags) costs ~8x the time (~5 min for the cpu profile's 55k
    # sentences) for 95% the same unit spans; words outside jieba's dictionary are then split, not merged.
    for pair in pseg.cut(sentence, HMM=False):
        words.append((pos, pos + len(pair.word), pair.flag))
        pos += len(pair.word)
    return _ernie_units(words)


def _ernie_units(words: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Merge runs of modifier/noun words that end on a noun into phrases; entities stay whole."""
    units, run = [], []

    def flush():
        # Trailing modifiers are not part of the phrase (a phrase ends on its head noun).
        head = len(run)
        while head > 0 and run[head - 1][2] not in NOUN_TAGS:
            head -= 1
        phrase, rest = run[:head], run[head:]
        if len(phrase) >= 2 and phrase[-1][1] - phrase[0][0] <= MAX_PHRASE_CHARS:
            units.append((phrase[0][0], phrase[-1][1], "phrase"))
        else:
            rest = phrase + rest
        for start, end, flag in rest:
            units.append((start, end, "entity" if flag in ENTITY_TAGS else "word"))
        run.clear()

    for word in words:
        if word[2] in MODIFIER_TAGS and word[1] > word[0] and not word[2].startswith("x"):
            run.append(word)
        else:
            flush()
            start, end, flag = word
            units.append((start, end, "entity" if flag in ENTITY_TAGS else "word"))
    flush()
    return units


def unit_start_flags(offsets: list[tuple[int, int]], spans: list[tuple[int, int, str]]) -> np.ndarray:
    """Per token 1 if it starts a masking unit, 0 if it continues the unit of the previous token."""
    starts = {start for start, _, _ in spans}
    flags = np.ones(len(offsets), dtype=np.uint8)
    unit_of_char = {}
    for k, (start, end, _) in enumerate(spans):
        for c in range(start, end):
            unit_of_char[c] = k
    prev_unit = None
    for i, (start, end) in enumerate(offsets):
        unit = unit_of_char.get(start)
        if i > 0 and unit is not None and unit == prev_unit and start not in starts:
            flags[i] = 0
        prev_unit = unit
    return flags


@dataclass
class MaskingConfig:
    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1


def candidate_units(unit_start: np.ndarray, special: np.ndarray) -> list[list[int]]:
    """Token positions grouped into masking units; special tokens ([CLS]/[SEP]/[PAD]) excluded."""
    units: list[list[int]] = []
    for i in range(len(unit_start)):
        if special[i]:
            continue
        if unit_start[i] or not units or units[-1][-1] != i - 1:
            units.append([i])
        else:
            units[-1].append(i)
    return units


def mask_tokens(
    input_ids: np.ndarray,
    unit_start: np.ndarray,
    special: np.ndarray,
    rng: random.Random,
    config: MaskingConfig,
    mask_id: int,
    random_ids: np.ndarray,
):
    """Return (corrupted ids, masked positions ascending, original ids at those positions)."""
    units = candidate_units(unit_start, special)
    rng.shuffle(units)
    num_to_predict = min(config.max_predictions_per_seq, max(1, int(round(len(input_ids) * config.masked_lm_prob))))
    chosen: list[int] = []
    for unit in units:
        if len(chosen) >= num_to_predict:
            break
        if len(chosen) + len(unit) > num_to_predict:
            continue  # take a unit whole or not at all; a smaller one may still fit
        chosen.extend(unit)
    chosen.sort()
    output = np.array(input_ids, dtype=np.int64, copy=True)
    labels = output[chosen].copy()
    for pos in chosen:
        draw = rng.random()
        if draw < config.mask_token_prob:
            output[pos] = mask_id
        elif draw < config.mask_token_prob + config.random_token_prob:
            output[pos] = random_ids[rng.randrange(len(random_ids))]
        # else: keep the original token
    return output, np.array(chosen, dtype=np.int64), labels
