"""One reader for every SQuAD-style MRC file: one row per question, offsets verified.

Quirks handled (see the data dir's README): answer_start = -1 (located with context.find), answers with
stray spaces (stripped, start moved with them), is_impossible as the strings "true"/"false", CAIL's
YES/NO answers (not spans: dropped; a question left with none is skipped as 'yes/no answer'), empty
answer lists, Traditional Chinese (kept as is). Bad input is one line naming the file and the id: in
strict mode it raises MRCError, in the default lenient mode the question is skipped and counted.
"""
import hashlib
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .errors import MRCError
from .io_utils import REPO_ROOT, read_json

log = logging.getLogger("mrc.data")

DATA_DIR_ENV = "MRC_DATA_DIR"
SOURCES = {
    "checklist_demo": "dureader_checklist/demo.json",
    "checklist_dev": "dureader_checklist/dev_public.json",
    "robust_demo": "dureader_robust/demo_train.json",
    "robust_dev": "dureader_robust/dev.json",
    "cmrc2018_dev": "cmrc2018/cmrc2018_dev.json",
    "cmrc2018_trial": "cmrc2018/cmrc2018_trial.json",
    "drcd_dev": "drcd/DRCD_dev.json",
    "drcd_test": "drcd/DRCD_test.json",
    "cail_dev": "cail2019/dev_ground_truth.json",
    "cail_test": "cail2019/test_ground_truth.json",
    "squad2_zh": "squad2_zh_mt/dev-v2.0-zh.json",
    # the official files, for users who ran `bash run.sh download` (MRC_DATA_DIR=data)
    "checklist_train": "dureader_checklist/train.json",
    "checklist_dev_full": "dureader_checklist/dev.json",
    "checklist_test1": "dureader_checklist/test1.json",
}
# Evaluation files: never training data, never pre-training text.
EVAL_SOURCES = ("checklist_dev", "checklist_dev_full", "checklist_test1")
COLUMNS = ["id", "source", "title", "context", "question", "answers", "is_impossible", "category", "passage_id"]
YES_NO = {"YES", "NO"}


def resolve_data_dir(data_dir=None) -> Path:
    """flag > $MRC_DATA_DIR > ../shared/data next to the repo (when present) > data/ in the repo."""
    if data_dir:
        chosen = Path(data_dir)
    elif os.environ.get(DATA_DIR_ENV):
        chosen = Path(os.environ[DATA_DIR_ENV])
    elif (REPO_ROOT.parent / "shared" / "data").is_dir():
        chosen = REPO_ROOT.parent / "shared" / "data"
    else:
        chosen = REPO_ROOT / "data"
    return chosen.resolve()


def source_path(name: str, data_dir=None) -> Path:
    if name not in SOURCES:
        raise MRCError(f"unknown data source '{name}' (known: {', '.join(SOURCES)})")
    return resolve_data_dir(data_dir) / "mrc" / SOURCES[name]


def corpus_path(data_dir=None) -> Path:
    return resolve_data_dir(data_dir) / "corpus" / "thucnews_subset.txt"


@dataclass
class SkipReport:
    """Questions skipped (lenient mode) and answers repaired, with one example message per reason."""

    path: str
    skipped: Counter = field(default_factory=Counter)
    repaired: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def skip(self, reason: str, message: str):
        self.skipped[reason] += 1
        self.examples.setdefault(reason, message)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())


def _parse_bool(value, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if value is None:
        return False
    raise _Bad("wrong type", f"{where}: is_impossible must be a boolean, got {value!r}")


class _Bad(Exception):
    """A problem with one question: (reason key, full one-line message)."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def _locate(context: str, text: str, start) -> tuple[int, str | None]:
    """Character start of `text` in `context` near `start`; second value names a repair, if any."""
    if isinstance(start, int) and start >= 0 and context[start:start + len(text)] == text:
        return start, None
    found = [i for i in _find_all(context, text)]
    if not found:
        return -1, None
    if not isinstance(start, int) or start < 0:
        return found[0], "located answer_start -1"
    # a wrong offset: take the occurrence nearest to the stated one
    return min(found, key=lambda i: abs(i - start)), "moved wrong answer_start"


def _find_all(context: str, text: str):
    i = context.find(text)
    while i != -1:
        yield i
        i = context.find(text, i + 1)


def _clean_answers(raw_answers, context: str, where: str, report: SkipReport) -> list[dict]:
    if not isinstance(raw_answers, list):
        raise _Bad("wrong type", f"{where}: answers must be a list, got {type(raw_answers).__name__}")
    answers, seen, yes_no, missing = [], set(), 0, None
    for ans in raw_answers:
        if not isinstance(ans, dict) or "text" not in ans:
            raise _Bad("missing key", f"{where}: each answer needs a 'text' key")
        text, start = ans["text"], ans.get("answer_start", -1)
        if not isinstance(text, str):
            raise _Bad("wrong type", f"{where}: answer text must be a string, got {type(text).__name__}")
        if isinstance(start, str) and start.lstrip("-").isdigit():
            start = int(start)
        if start is None:
            start = -1
        if isinstance(start, bool) or not isinstance(start, int):
            raise _Bad("wrong type", f"{where}: answer_start must be an integer, got {start!r}")
        if text.strip() in YES_NO and start in (-1, None):
            yes_no += 1
            continue
        stripped = text.strip()
        if not stripped:
            continue  # an annotator's empty answer (CAIL) or the no-answer placeholder
        if stripped != text and isinstance(start, int) and start >= 0:
            start += len(text) - len(text.lstrip())
            report.repaired["stripped spaces"] += 1
        text = stripped
        start, repair = _locate(context, text, start)
        if start < 0:  # one annotator's answer that is not in the passage: drop it, keep the others
            missing = missing or f"{where}: answer {text[:30]!r} is not in the context"
            report.repaired["dropped answer not in context"] += 1
            continue
        if repair:
            report.repaired[repair] += 1
        if (text, start) not in seen:
            seen.add((text, start))
            answers.append({"text": text, "answer_start": start})
    if not answers and missing:
        raise _Bad("answer not in context", missing)
    if not answers and yes_no:
        raise _Bad("yes/no answer", f"{where}: YES/NO answer, not a span of the passage")
    return answers


def _question_row(qa, context, title, source, path, report, with_answers=True) -> dict:
    if not isinstance(qa, dict):
        raise _Bad("wrong type", f"{path}: a 'qas' entry is not an object")
    qid = qa.get("id")
    if qid is None:
        raise _Bad("missing key", f"{path}: question {str(qa.get('question'))[:30]!r}: missing key 'id'")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise _Bad("wrong type", f"{path}: id {qid!r}: id must be a string")
    qid = str(qid)
    where = f"{path}: id {qid}"
    if "question" not in qa:
        raise _Bad("missing key", f"{where}: missing key 'question'")
    question = qa["question"]
    if not isinstance(question, str):
        raise _Bad("wrong type", f"{where}: question must be a string, got {type(question).__name__}")
    if not question.strip():
        raise _Bad("empty question", f"{where}: empty question")
    if not context.strip():
        raise _Bad("empty context", f"{where}: empty context")
    if with_answers:
        is_impossible = _parse_bool(qa.get("is_impossible", False), where)
        answers = [] if is_impossible else _clean_answers(qa.get("answers", []), context, where, report)
    else:  # prediction input: gold answers (even YES/NO or malformed ones) are not read
        is_impossible, answers = False, []
    category = qa.get("type", "")
    if not isinstance(category, str):
        raise _Bad("wrong type", f"{where}: type must be a string")
    return {
        "id": qid, "source": source, "title": title, "context": context, "question": question.strip(),
        "answers": answers, "is_impossible": is_impossible, "category": category,
        "passage_id": hashlib.md5(f"{source}\n{context}".encode("utf-8")).hexdigest()[:16],
    }


def load_file(path, source=None, strict=False, with_answers=True) -> tuple[pd.DataFrame, SkipReport]:
    """Read one SQuAD/DuReader-style file. Ids are the file's own. Returns (examples, skip report).

    with_answers=False (prediction input): answers are not parsed (answers [], is_impossible False), so
    only structural problems (missing/empty id, question or context, wrong types, duplicate ids) skip."""
    path = Path(path)
    source = source or path.stem
    report = SkipReport(str(path))
    root = read_json(path)
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise MRCError(f"{path}: expected a JSON object with a 'data' list (SQuAD format)")
    rows, ids = [], set()

    def problem(bad: _Bad):
        if strict:
            raise MRCError(str(bad))
        report.skip(bad.reason, str(bad))

    for doc in root["data"]:
        if not isinstance(doc, dict) or not isinstance(doc.get("paragraphs"), list):
            problem(_Bad("missing key", f"{path}: a 'data' entry has no 'paragraphs' list"))
            continue
        for para in doc["paragraphs"]:
            if not isinstance(para, dict) or "context" not in para or not isinstance(para.get("qas"), list):
                problem(_Bad("missing key", f"{path}: a paragraph lacks 'context' or a 'qas' list"))
                continue
            context = para["context"]
            if not isinstance(context, str):
                problem(_Bad("wrong type", f"{path}: a paragraph's context is not a string"))
                continue
            title = para.get("title") or doc.get("title") or para.get("casename") or ""
            title = title if isinstance(title, str) else str(title)
            for qa in para["qas"]:
                try:
                    row = _question_row(qa, context, title, source, path, report, with_answers)
                    if row["id"] in ids:
                        raise _Bad("duplicate id", f"{path}: id {row['id']}: duplicate id")
                except _Bad as bad:
                    problem(bad)
                    continue
                ids.add(row["id"])
                rows.append(row)
    if not rows and not report.total_skipped:
        raise MRCError(f"{path}: no questions in the file")
    return pd.DataFrame(rows, columns=COLUMNS), report


def check_train_sources(names, use: str = "training data") -> None:
    """Training (or pre-training) sets: known names, at least one, never an evaluation set."""
    names = list(names or [])
    if not names:
        raise MRCError("train_sources: empty; name at least one training set")
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise MRCError(f"train_sources: unknown set {unknown[0]} (known: {', '.join(SOURCES)})")
    leaked = sorted(set(names) & set(EVAL_SOURCES))
    if leaked:
        raise MRCError(f"train_sources: {', '.join(leaked)} is evaluation data and never {use}")


def load_sources(names, data_dir=None, strict=False) -> pd.DataFrame:
    """Concatenate named sources; ids become '<source>:<id>' so they are unique across files."""
    frames = []
    for name in names:
        df, report = load_file(source_path(name, data_dir), source=name, strict=strict)
        if report.total_skipped:
            log.info("%s: skipped %d questions (%s)", name, report.total_skipped, dict(report.skipped))
        df["id"] = name + ":" + df["id"]
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """Questions usable as training targets: unanswerable, or with at least one located span."""
    return df[df["is_impossible"] | (df["answers"].str.len() > 0)]


def iter_passages(df: pd.DataFrame):
    """Each distinct passage once, in first-seen order."""
    yield from df.drop_duplicates("passage_id")["context"]
