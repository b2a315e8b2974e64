"""Question (+ title) / passage -> model features with doc-stride windows (HF run_qa style).

One deterministic function of (tokenizer, max_len, stride, use_title): `build_features`.

Layout of one feature (segment A = token_type 0, segment B = token_type 1):

    [CLS] question [SEP] title [SEP] passage-window [SEP]      (use_title=True)
    [CLS] question [SEP] passage-window [SEP]                  (use_title=False)

The title goes into segment A after the question (its own [SEP]), so the passage window, the only
place an answer can be, keeps the whole of segment B. Question and title are capped at max_len // 4
and max_len // 8 tokens so a window always keeps at least half of max_len for the passage.

Tokenization is the HF Rust tokenizer (`mrc.vocab.fast_tokenizer`), question, title and passage each
encoded once without special tokens (unique passages once), then windows are cut here with HF
semantics of `stride`: consecutive windows overlap by `stride` passage tokens (paddlenlp's
tokenizer `stride` means something else). Offsets are character offsets into the passage, (-1, -1)
for every token that is not a passage token ([CLS], question, title, [SEP], padding).

Match types (`match_types=True`, DrQA's exact-match features as token types): a small model from random
init learns slowly that answers sit next to the question's words and that a question whose words are
absent from the passage is unanswerable, so both are given as input. A character "matches" another text
when a character bigram through it (with its left or right neighbour) occurs there; a token matches when
one of its characters does. Token types then are:

    0  [CLS], [SEP], title tokens not in the question     7  title token found in the question
    1  passage token not in the question                  2  passage token found in the question
    question tokens found in: 3 passage and title, 4 the passage only, 5 the title only, 6 neither
(DuReader titles are often the question the passage answers, so "which question words are in the
title" separates answerable from unanswerable questions about as well as the passage does.)

(the model's token-type embedding is extended to NUM_MATCH_TYPES = 8 rows: mrc.model.extend_token_types).

Labels: the first answer's token span when it lies wholly inside the window, else [CLS] (index 0)
for both start and end; unanswerable questions always point at [CLS]. `answerable` per feature is
1 exactly when the window holds the answer (the classifier learns "this window answers it").
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .errors import MRCError

FEATURE_FORMAT_VERSION = "f1"  # bump when the layout above changes: part of feature_key
NUM_MATCH_TYPES = 8


@dataclass
class Features:
    """Parallel per-feature lists (ragged token lists; padding happens in the collator)."""

    input_ids: list = field(default_factory=list)        # list[np.int64 array]
    token_type_ids: list = field(default_factory=list)   # list[np.int64 array]
    offsets: list = field(default_factory=list)          # list[np.int32 array (n, 2)], -1 outside passage
    example_index: list = field(default_factory=list)    # row of the input DataFrame
    example_id: list = field(default_factory=list)       # the example's id (str)
    start_positions: list = field(default_factory=list)  # token index (0 = [CLS])
    end_positions: list = field(default_factory=list)
    answerable: list = field(default_factory=list)       # 1 when this window holds the answer
    key: str = ""                                         # feature_key(...)

    def __len__(self):
        return len(self.input_ids)

    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)

    def subset(self, indices) -> "Features":
        indices = list(indices)
        out = Features(key=self.key)
        for name in ("input_ids", "token_type_ids", "offsets", "example_index", "example_id",
                     "start_positions", "end_positions", "answerable"):
            values = getattr(self, name)
            setattr(out, name, [values[i] for i in indices])
        return out

    def padded_offsets(self, max_len: int | None = None) -> np.ndarray:
        """(n_features, max_len, 2) int32, -1 padded: the npz `offsets` array."""
        max_len = max_len or max((len(o) for o in self.offsets), default=0)
        out = np.full((len(self.offsets), max_len, 2), -1, dtype=np.int32)
        for i, off in enumerate(self.offsets):
            out[i, : len(off)] = off
        return out


def tokenizer_hash(tokenizer) -> str:
    """Hash of the whole serialized tokenizer (vocab + normalizer: lowercasing etc.)."""
    return hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()[:12]


def feature_key(tokenizer, max_len: int, stride: int, use_title: bool, match_types: bool = False) -> str:
    """Identifies the feature layout; two logits files line up only when their keys are equal."""
    key = f"{FEATURE_FORMAT_VERSION}|vocab={tokenizer_hash(tokenizer)}|max_len={max_len}|stride={stride}|title={int(bool(use_title))}"
    return key + ("|match=1" if match_types else "")


def bigram_match(text: str, other: str) -> np.ndarray:
    """Per character of `text`: True when a character bigram through it (with its left or right
    neighbour) occurs in `other`."""
    if not text:
        return np.zeros(0, dtype=bool)
    bigrams = {other[i:i + 2] for i in range(len(other) - 1)}
    hit = np.array([text[i:i + 2] in bigrams for i in range(len(text) - 1)] + [False], dtype=bool)
    out = hit.copy()
    out[1:] |= hit[:-1]
    return out


def token_match(offsets, char_match: np.ndarray) -> np.ndarray:
    """Per token (char offsets (n, 2)): True when one of its characters matches."""
    if len(char_match) == 0:
        return np.zeros(len(offsets), dtype=bool)
    cum = np.concatenate([[0], np.cumsum(char_match)])
    off = np.clip(np.asarray(offsets, dtype=np.int64).reshape(-1, 2), 0, len(char_match))
    return cum[off[:, 1]] > cum[off[:, 0]]


def _special_id(tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise MRCError(f"tokenizer vocabulary has no {token} token")
    return token_id


def _encode(tokenizer, texts):
    return tokenizer.encode_batch([t if t else "" for t in texts], add_special_tokens=False)


def _answer_char_span(row):
    """(start, end) in characters of the first answer, or None when unanswerable / no gold."""
    answers = row.get("answers") if hasattr(row, "get") else row["answers"]
    if row["is_impossible"] or answers is None or len(answers) == 0:
        return None
    first = answers[0]
    start = int(first["answer_start"])
    return start, start + len(first["text"])


def window_starts(n_tokens: int, window: int, stride: int) -> list[int]:
    """Start token of each window: step window - stride (HF overlap semantics); covers every token."""
    if window <= 0:
        raise MRCError(f"max_len too small: no room left for the passage (window {window})")
    if stride >= window:
        raise MRCError(f"stride {stride} must be smaller than the passage window {window}")
    starts = [0]
    while starts[-1] + window < n_tokens:
        starts.append(starts[-1] + window - stride)
    return starts


def build_features(df, tokenizer, max_len: int, stride: int, use_title: bool, match_types: bool = False) -> Features:
    """Features for every row of `df` (columns of mrc.data.load_file: id, question, title, context,
    answers, is_impossible). Rows without gold answers get [CLS] labels (harmless at prediction)."""
    cls_id, sep_id = _special_id(tokenizer, "[CLS]"), _special_id(tokenizer, "[SEP]")
    max_question, max_title = max_len // 4, max_len // 8
    questions = _encode(tokenizer, df["question"].tolist())
    titles = _encode(tokenizer, df["title"].fillna("").tolist()) if use_title else None
    unique_contexts = list(dict.fromkeys(df["context"].tolist()))
    context_index = {c: i for i, c in enumerate(unique_contexts)}
    passages = _encode(tokenizer, unique_contexts)

    feats = Features(key=feature_key(tokenizer, max_len, stride, use_title, match_types))
    for row_i, row in enumerate(df.itertuples(index=False)):
        row = row._asdict()
        seg_a = [cls_id] + questions[row_i].ids[:max_question] + [sep_id]
        n_question = len(seg_a) - 2
        if use_title and titles[row_i].ids:
            seg_a += titles[row_i].ids[:max_title] + [sep_id]
        types_a = np.zeros(len(seg_a), dtype=np.int64)
        passage = passages[context_index[row["context"]]]
        p_ids = np.asarray(passage.ids, dtype=np.int64)
        p_off = np.asarray(passage.offsets, dtype=np.int32).reshape(-1, 2)
        p_types = np.ones(len(p_ids), dtype=np.int64)
        if match_types:
            question, context = str(row["question"]), str(row["context"])
            title = row["title"] if use_title and isinstance(row["title"], str) else ""
            q_off = np.asarray(questions[row_i].offsets, dtype=np.int32).reshape(-1, 2)[:n_question]
            in_passage = token_match(q_off, bigram_match(question, context))
            in_title = token_match(q_off, bigram_match(question, title))
            types_a[1: 1 + n_question] = np.select([in_passage & in_title, in_passage, in_title], [3, 4, 5], 6)
            if len(seg_a) > n_question + 2:  # the title's tokens
                t_off = np.asarray(titles[row_i].offsets, dtype=np.int32).reshape(-1, 2)[:max_title]
                types_a[n_question + 2: n_question + 2 + len(t_off)] = np.where(token_match(t_off, bigram_match(title, question)), 7, 0)
            p_types = np.where(token_match(p_off, bigram_match(context, question)), 2, 1)
        window = max_len - len(seg_a) - 1
        span = _answer_char_span(row)
        for start in window_starts(len(p_ids), window, stride):
            stop = min(start + window, len(p_ids))
            ids = np.concatenate([np.asarray(seg_a, dtype=np.int64), p_ids[start:stop], [sep_id]])
            types = np.concatenate([types_a, p_types[start:stop], [1]])
            offsets = np.full((len(ids), 2), -1, dtype=np.int32)
            offsets[len(seg_a): len(seg_a) + stop - start] = p_off[start:stop]
            s_tok = e_tok = 0
            if span is not None and stop > start:
                s_tok, e_tok = _label_tokens(offsets, len(seg_a), len(seg_a) + stop - start, *span)
            feats.input_ids.append(ids)
            feats.token_type_ids.append(types)
            feats.offsets.append(offsets)
            feats.example_index.append(row_i)
            feats.example_id.append(str(row["id"]))
            feats.start_positions.append(s_tok)
            feats.end_positions.append(e_tok)
            feats.answerable.append(int(s_tok > 0))
    return feats


def _label_tokens(offsets, first: int, last_excl: int, char_start: int, char_end: int):
    """Token span [s, e] (inclusive) covering [char_start, char_end) inside tokens first..last_excl-1,
    or (0, 0) when the window does not hold the whole answer."""
    if not (offsets[first, 0] <= char_start and offsets[last_excl - 1, 1] >= char_end):
        return 0, 0
    s = first
    while s < last_excl and offsets[s, 1] <= char_start:  # first token ending after the answer start
        s += 1
    e = last_excl - 1
    while e > s and offsets[e, 0] >= char_end:  # last token starting before the answer end
        e -= 1
    return s, e
