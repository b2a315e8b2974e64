"""Pre-training text -> token store -> MLM/NSP/SOP instances (google-research/bert create_pretraining_data).

Nothing here grows with the corpus in memory: documents stream through the tokenizer into flat binary
files (token ids, masking-unit flags, sentence and document offsets) that are read back memory-mapped;
instances are written the same way and read lazily by `PretrainingDataset`. Masks are drawn on the fly
by `PretrainingCollator` from a seed per (instance, epoch): static masking (bert/ernie/albert) keeps
epoch 0 forever, so an instance always has the same mask (dupe_factor copies get different ones);
dynamic masking (roberta) draws a new mask each epoch.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from .errors import MRCError
from .io_utils import atomic_write_json
from .masking import MaskingConfig, mask_tokens, unit_spans, unit_start_flags

log = logging.getLogger("mrc.pretrain_data")

PAIR_TASKS = ("nsp", "sop", "none")
DATA_VERSION = 3  # bump when instance creation changes: cached data of an older version is rebuilt
# A sentence ends after 。！？ (and any closing quotes/brackets right after them).
_SENTENCE = re.compile(r".+?(?:[。！？]+[”’」』）)\"']*|$)", re.S)


def split_sentences(text: str) -> list[str]:
    """Split on 。！？ keeping the punctuation with its sentence; whitespace-only pieces dropped."""
    return [s.strip() for s in _SENTENCE.findall(text.replace("\u3000", " ")) if s.strip()]


# ----------------------------------------------------------------------------------------------- text

def eval_sentences(eval_sources, data_dir=None) -> set[str]:
    """Every sentence of the evaluation files' passages: kept out of pre-training text."""
    from .data import iter_passages, load_sources

    if not eval_sources:
        return set()
    df = load_sources(list(eval_sources), data_dir)
    return {s for passage in iter_passages(df) for s in split_sentences(passage)}


def iter_documents(corpus_file=None, passages: Iterable[str] = (), corpus_lines: int | None = None,
                   exclude: set[str] = frozenset(), stats: dict | None = None) -> Iterator[list[str]]:
    """Documents as lists of sentences: one per corpus line (an article), then one per MRC passage.

    Sentences in `exclude` (evaluation passages) are dropped; counts go to `stats`.
    """
    stats = stats if stats is not None else {}
    for key in ("documents", "sentences", "excluded_sentences"):
        stats.setdefault(key, 0)

    def emit(text):
        sentences = split_sentences(text)
        kept = [s for s in sentences if s not in exclude]
        stats["excluded_sentences"] += len(sentences) - len(kept)
        if kept:
            stats["documents"] += 1
            stats["sentences"] += len(kept)
            return kept
        return None

    if corpus_file is not None:
        if not Path(corpus_file).is_file():
            raise MRCError(f"{corpus_file}: pre-training corpus not found")
        with open(corpus_file, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f):
                if corpus_lines is not None and n >= corpus_lines:
                    break
                doc = emit(line)
                if doc:
                    yield doc
    for passage in passages:
        doc = emit(passage)
        if doc:
            yield doc


def train_passages(train_sources, data_dir=None, max_passages: int | None = None) -> list[str]:
    """Distinct passages of the MRC training sets; evaluation sources are refused."""
    from .data import check_train_sources, iter_passages, load_sources

    check_train_sources(train_sources, "pre-training text")
    passages = list(iter_passages(load_sources(list(train_sources), data_dir)))
    return passages[:max_passages] if max_passages is not None else passages


# ---------------------------------------------------------------------------------------- token store

class _FlatWriter:
    """Append-only binary arrays in a temp dir, moved into place only when complete (a kill leaves nothing)."""

    def __init__(self, out_dir, dtypes: dict):
        self.out_dir = Path(out_dir)
        self.tmp_dir = self.out_dir.with_name(self.out_dir.name + f".tmp{os.getpid()}")
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir(parents=True)
        self.dtypes = dtypes
        self.files = {name: open(self.tmp_dir / f"{name}.bin", "wb") for name in dtypes}

    def append(self, name, values):
        self.files[name].write(np.asarray(values, dtype=self.dtypes[name]).tobytes())

    def close(self, meta: dict):
        for f in self.files.values():
            f.close()
        atomic_write_json(self.tmp_dir / "meta.json", {**meta, "dtypes": self.dtypes})
        shutil.rmtree(self.out_dir, ignore_errors=True)
        os.replace(self.tmp_dir, self.out_dir)


def _open_flat(path) -> tuple[dict, dict]:
    path = Path(path)
    meta = json.loads((path / "meta.json").read_text(encoding="utf-8"))
    arrays = {}
    for name, dtype in meta["dtypes"].items():
        file = path / f"{name}.bin"
        arrays[name] = (np.memmap(file, dtype=dtype, mode="r") if file.stat().st_size
                        else np.zeros(0, dtype=dtype))
    return meta, arrays


def build_token_store(documents: Iterable[list[str]], fast_tok, unit_mode: str, out_dir, batch_sentences=2048) -> Path:
    """Tokenise documents (no special tokens) into a flat store: ids, unit flags, sentence/doc offsets."""
    writer = _FlatWriter(out_dir, {"ids": "int32", "unit_start": "uint8", "sent_offsets": "int64", "doc_offsets": "int64"})
    n_tokens = n_sents = n_docs = 0
    writer.append("sent_offsets", [0])
    writer.append("doc_offsets", [0])
    pending_sents: list[str] = []
    pending_doc_ends: list[int] = []  # sentence count (within pending) at which each document ends

    def flush():
        nonlocal n_tokens, n_sents, n_docs
        if not pending_sents:
            return
        encodings = fast_tok.encode_batch(pending_sents, add_special_tokens=False)
        sent_ends = []
        for sentence, enc in zip(pending_sents, encodings):
            flags = (np.ones(len(enc.ids), dtype=np.uint8) if unit_mode == "char"
                     else unit_start_flags(enc.offsets, unit_spans(sentence, unit_mode)))
            writer.append("ids", enc.ids)
            writer.append("unit_start", flags)
            n_tokens += len(enc.ids)
            sent_ends.append(n_tokens)
        writer.append("sent_offsets", sent_ends)
        writer.append("doc_offsets", [n_sents + e for e in pending_doc_ends])
        n_sents += len(pending_sents)
        n_docs += len(pending_doc_ends)
        pending_sents.clear()
        pending_doc_ends.clear()

    for doc in documents:
        pending_sents.extend(doc)
        pending_doc_ends.append(len(pending_sents))
        if len(pending_sents) >= batch_sentences:
            flush()
    flush()
    writer.close({"tokens": n_tokens, "sentences": n_sents, "documents": n_docs, "unit_mode": unit_mode})
    log.info("token store %s: %d documents, %d sentences, %d tokens", out_dir, n_docs, n_sents, n_tokens)
    return Path(out_dir)


class TokenStore:
    """Memory-mapped tokenised documents: `document(i)` -> list of (ids, unit_start) per sentence."""

    def __init__(self, path):
        self.meta, arrays = _open_flat(path)
        self.ids, self.unit_start = arrays["ids"], arrays["unit_start"]
        self.sent_offsets, self.doc_offsets = arrays["sent_offsets"], arrays["doc_offsets"]

    def __len__(self):
        return len(self.doc_offsets) - 1

    def document(self, i: int) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for s in range(int(self.doc_offsets[i]), int(self.doc_offsets[i + 1])):
            a, b = int(self.sent_offsets[s]), int(self.sent_offsets[s + 1])
            if b > a:
                out.append((self.ids[a:b], self.unit_start[a:b]))
        return out


# ------------------------------------------------------------------------------------------ instances

def _truncate_seq_pair(a: list, b: list, max_num_tokens: int, rng: random.Random):
    """google's truncate_seq_pair: trim the longer side, from the front or the back at random."""
    while len(a) + len(b) > max_num_tokens:
        trunc = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def instances_from_document(store: TokenStore, doc_index: int, max_seq_len: int, short_seq_prob: float,
                            pair_task: str, rng: random.Random):
    """google create_instances_from_document. Yields (tokens_a, tokens_b, label, b_doc) with tokens as
    lists of (id, unit_start) and b_doc the document B was taken from; tokens_b empty for pair_task 'none'.

    nsp: B is the real continuation, or (half the time) text from a random *other* document, label 1. sop: B is the continuation; half the time A and B are swapped, label 1.
    none (RoBERTa): one segment of contiguous sentences, no pair label.
    """
    document = store.document(doc_index)
    has_pair = pair_task != "none"
    max_num_tokens = max_seq_len - (3 if has_pair else 2)
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    chunk, length, i = [], 0, 0
    while i < len(document):
        segment = list(zip(document[i][0].tolist(), document[i][1].tolist()))
        chunk.append(segment)
        length += len(segment)
        if i == len(document) - 1 or length >= target_seq_length:
            if chunk:
                if not has_pair:
                    tokens_a = [t for seg in chunk for t in seg][:max_num_tokens]
                    yield tokens_a, [], 0, doc_index
                    chunk, length = [], 0
                    i += 1
                    continue
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for seg in chunk[:a_end] for t in seg]
                tokens_b = []
                # google forces a random B whenever the chunk is one segment, which on short passages
                # makes ~68% of pairs negatives; here the label is a fair coin and a one-segment chunk is
                # cut inside for a positive (B still follows A in the text).
                is_random_next = pair_task == "nsp" and len(store) > 1 and rng.random() < 0.5
                if is_random_next:
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_doc_index = rng.randint(0, len(store) - 1)
                        if random_doc_index != doc_index:
                            break
                    if random_doc_index == doc_index:  # google tries 10 times; make sure it is another document
                        random_doc_index = (doc_index + 1 + rng.randrange(len(store) - 1)) % len(store)
                    random_document = store.document(random_doc_index)
                    if random_document:
                        random_start = rng.randint(0, len(random_document) - 1)
                        for j in range(random_start, len(random_document)):
                            tokens_b.extend(zip(random_document[j][0].tolist(), random_document[j][1].tolist()))
                            if len(tokens_b) >= target_b_length:
                                break
                    # the unused segments go back to be used by the next instance
                    i -= len(chunk) - a_end
                elif len(chunk) == 1:
                    if len(tokens_a) >= 2:
                        cut = rng.randint(1, len(tokens_a) - 1)
                        tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
                else:
                    tokens_b = [t for seg in chunk[a_end:] for t in seg]
                _truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                if tokens_a and tokens_b:
                    label = int(is_random_next)
                    if pair_task == "sop" and rng.random() < 0.5:
                        tokens_a, tokens_b, label = tokens_b, tokens_a, 1
                    yield tokens_a, tokens_b, label, random_doc_index if is_random_next else doc_index
            chunk, length = [], 0
        i += 1


def build_instances(store: TokenStore, out_dir, cls_id: int, sep_id: int, max_seq_len: int, short_seq_prob: float,
                    pair_task: str, dupe_factor: int, rng: random.Random) -> Path:
    """Write every instance ([CLS] A [SEP] B [SEP]) of `dupe_factor` passes over the documents.

    Per instance: ids and unit flags (flat), offset, len_a (tokens of A, i.e. [CLS] A [SEP] spans len_a + 2),
    label (NSP: 1 = random next; SOP: 1 = swapped; none: 0) and the documents of A and B (provenance).
    """
    if pair_task not in PAIR_TASKS:
        raise MRCError(f"pair_task: unknown value {pair_task!r} (expected one of {', '.join(PAIR_TASKS)})")
    writer = _FlatWriter(out_dir, {"ids": "int32", "unit_start": "uint8", "offsets": "int64", "len_a": "int32",
                                   "label": "int8", "a_doc": "int32", "b_doc": "int32"})
    writer.append("offsets", [0])
    total = 0
    n = 0
    for _ in range(dupe_factor):
        for doc_index in range(len(store)):
            for a, b, label, b_doc in instances_from_document(store, doc_index, max_seq_len, short_seq_prob,
                                                                     pair_task, rng):
                ids = [cls_id] + [t for t, _ in a] + [sep_id]
                units = [1] + [u for _, u in a] + [1]
                if b:
                    ids += [t for t, _ in b] + [sep_id]
                    units += [u for _, u in b] + [1]
                writer.append("ids", ids)
                writer.append("unit_start", units)
                total += len(ids)
                writer.append("offsets", [total])
                writer.append("len_a", [len(a)])
                writer.append("label", [label])
                writer.append("a_doc", [doc_index])
                writer.append("b_doc", [b_doc])
                n += 1
    writer.close({"instances": n, "tokens": total, "pair_task": pair_task, "max_seq_len": max_seq_len,
                  "dupe_factor": dupe_factor})
    log.info("instances %s: %d (%d tokens, pair task %s, dupe factor %d)", out_dir, n, total, pair_task, dupe_factor)
    return Path(out_dir)


class PretrainingDataset:
    """Memory-mapped instances; item i -> dict(index, input_ids, unit_start, token_type_ids, label)."""

    def __init__(self, path):
        self.path = Path(path)
        self.meta, arrays = _open_flat(path)
        self.ids, self.unit_start, self.offsets = arrays["ids"], arrays["unit_start"], arrays["offsets"]
        self.len_a, self.label = arrays["len_a"], arrays["label"]
        self.a_doc, self.b_doc = arrays["a_doc"], arrays["b_doc"]

    def __len__(self):
        return len(self.len_a)

    def __getitem__(self, i):
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        ids = np.array(self.ids[a:b], dtype=np.int64)
        token_type = np.zeros(len(ids), dtype=np.int64)
        token_type[int(self.len_a[i]) + 2:] = 1
        return {"index": i, "input_ids": ids, "unit_start": np.array(self.unit_start[a:b]),
                "token_type_ids": token_type, "label": int(self.label[i])}


class PretrainingCollator:
    """Masks on the fly and pads to the longest instance in the batch (dynamic padding).

    Output: input_ids, token_type_ids, attention_mask [B, L]; masked_positions [M] flattened over B*L
    (what the paddlenlp *ForPretraining heads gather); masked_lm_labels [M]; next_sentence_labels [B].
    Nothing needs an ignore index: only masked positions carry MLM labels.
    """

    def __init__(self, tokenizer_ids: dict, vocab_size: int, masking: MaskingConfig, seed: int, dynamic: bool):
        self.mask_id = tokenizer_ids["mask"]
        self.pad_id = tokenizer_ids["pad"]
        self.special_ids = np.array(sorted(set(tokenizer_ids["special"])), dtype=np.int64)
        self.random_ids = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), self.special_ids)
        self.masking = masking
        self.seed = seed
        self.dynamic = dynamic
        self.epoch = 0  # set by the trainer callback at each epoch start (used only when dynamic)

    def mask(self, example):
        epoch = self.epoch if self.dynamic else 0
        rng = random.Random(f"{self.seed}:{epoch}:{example['index']}")
        special = np.isin(example["input_ids"], self.special_ids)
        return mask_tokens(example["input_ids"], example["unit_start"], special, rng, self.masking,
                           self.mask_id, self.random_ids)

    def __call__(self, examples):
        width = max(len(e["input_ids"]) for e in examples)
        batch = len(examples)
        input_ids = np.full((batch, width), self.pad_id, dtype=np.int64)
        token_type_ids = np.zeros((batch, width), dtype=np.int64)
        attention_mask = np.zeros((batch, width), dtype=np.int64)
        positions, labels = [], []
        for row, example in enumerate(examples):
            ids, pos, lab = self.mask(example)
            n = len(ids)
            input_ids[row, :n] = ids
            token_type_ids[row, :n] = example["token_type_ids"]
            attention_mask[row, :n] = 1
            positions.append(pos + row * width)
            labels.append(lab)
        return {
            "input_ids": input_ids,
            "token_type_ids": token_type_ids,
            "attention_mask": attention_mask,
            "masked_positions": np.concatenate(positions).astype(np.int64),
            "masked_lm_labels": np.concatenate(labels).astype(np.int64),
            "next_sentence_labels": np.array([e["label"] for e in examples], dtype=np.int64),
        }


def tokenizer_ids(tokenizer) -> dict:
    """The special-token ids the collator needs, from a paddlenlp tokenizer."""
    specials = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.all_special_tokens]
    return {"mask": tokenizer.mask_token_id, "pad": tokenizer.pad_token_id, "cls": tokenizer.cls_token_id,
            "sep": tokenizer.sep_token_id, "special": specials}


def fingerprint(obj) -> str:
    """Stable short hash of a JSON-able object (decides whether cached data still matches the config)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]
