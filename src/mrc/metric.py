"""The official DuReader-checklist metric (2021 LIC evaluation script), reimplemented exactly.

- normalise: lowercase, delete the official punctuation list (only those characters);
- tokens: every CJK character (and '=') is one token, each run of other characters is one token;
- F1: longest common *contiguous* token run between prediction and a gold answer, max over gold answers;
- EM: normalised strings equal, any gold answer;
- an unanswerable question scores 1 only when prediction.lower() == 'no answer';
- missing ids score 0 and are counted as SKIP; one micro-average, and per category (type prefix).
Not paddlenlp.metrics.squad, which differs in tokenisation and inverts is_impossible.
"""
from collections import OrderedDict

from .errors import MRCError
from .io_utils import read_json

NO_ANSWER = "no answer"
# The official list; '……' is two characters, so it never matches a single character (as officially).
_PUNCTUATION = {
    ":", "_", "`", "，", "。", "：", "？", "！", "(", ")", "“", "”", "；", "’", "《", "》", "……", "·", "、", ",",
    "「", "」", "（", "）", "－", "～", "『", "』", "|",
}
CHECKLIST_CATEGORIES = ("vocab", "phrase", "semantic-role", "fault-tolerant", "reasoning")
CATEGORIES = ("in-domain",) + CHECKLIST_CATEGORIES


def is_cjk(cp: int) -> bool:
    """The official script's CJK code point ranges (also the vocab's notion of a CJK character)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def normalize(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)


def tokenize(text: str) -> list[str]:
    tokens, run = [], ""
    for ch in text:
        if is_cjk(ord(ch)) or ch == "=":
            if run:
                tokens.append(run)
                run = ""
            tokens.append(ch)
        else:
            run += ch
    if run:
        tokens.append(run)
    return tokens


def _longest_common_run(a: list, b: list) -> int:
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                if cur[j + 1] > best:
                    best = cur[j + 1]
        prev = cur
    return best


def f1_score(prediction: str, gold_answers: list[str]) -> float:
    pred_tokens = tokenize(normalize(prediction))
    best = 0.0
    for gold in gold_answers:
        gold_tokens = tokenize(normalize(gold))
        common = _longest_common_run(gold_tokens, pred_tokens)
        if common:
            precision, recall = common / len(pred_tokens), common / len(gold_tokens)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def exact_match(prediction: str, gold_answers: list[str]) -> float:
    pred = normalize(prediction)
    return float(any(normalize(gold) == pred for gold in gold_answers))


def is_no_answer(prediction: str) -> bool:
    return prediction.lower() == NO_ANSWER


def score_one(prediction: str, gold: dict) -> tuple[float, float]:
    """(F1, EM) in [0, 1] for one question."""
    if gold["is_impossible"]:
        hit = float(is_no_answer(prediction))
        return hit, hit
    return f1_score(prediction, gold["answers"]), exact_match(prediction, gold["answers"])


def category_of(qtype: str) -> str:
    """Map a question type ('vocab_noun', 'fault-tolerant_typo', ...) to its leaderboard category."""
    for cat in CATEGORIES:
        if qtype.startswith(cat):
            return cat
    return qtype


def check_predictions(predictions, where="predictions") -> dict:
    if not isinstance(predictions, dict):
        raise MRCError(f"{where}: must be a JSON object {{id: answer string}}, got {type(predictions).__name__}")
    for key, value in predictions.items():
        if not isinstance(value, str):
            raise MRCError(f"{where}: id {key}: answer must be a string, got {type(value).__name__}")
    return predictions


def evaluate(gold: dict, predictions: dict, tag: str | None = None) -> OrderedDict:
    """Official scores (percentages) overall and per category; `tag` keeps types starting with it."""
    check_predictions(predictions)
    totals = {}  # category -> [f1 sum, em sum, count]
    f1_sum = em_sum = 0.0
    total = skip = 0
    for qid, item in gold.items():
        if tag is not None and not item.get("category", "").startswith(tag):
            continue
        total += 1
        prediction = predictions.get(str(qid))
        if prediction is None:
            skip += 1
            f1 = em = 0.0
        else:
            f1, em = score_one(prediction, item)
        f1_sum += f1
        em_sum += em
        cat = category_of(item.get("category", ""))
        if cat:
            acc = totals.setdefault(cat, [0.0, 0.0, 0])
            acc[0] += f1
            acc[1] += em
            acc[2] += 1
    result = OrderedDict(
        F1=100.0 * f1_sum / total if total else 0.0,
        EM=100.0 * em_sum / total if total else 0.0,
        TOTAL=total,
        SKIP=skip,
    )
    for cat in sorted(totals, key=lambda c: (c not in CATEGORIES, CATEGORIES.index(c) if c in CATEGORIES else 0, c)):
        f1, em, n = totals[cat]
        result[f"F1_{cat}"] = 100.0 * f1 / n
        result[f"EM_{cat}"] = 100.0 * em / n
        result[f"N_{cat}"] = n
    present = [c for c in CHECKLIST_CATEGORIES if c in totals]
    if present:
        # the leaderboard's checklist F1: unweighted mean of the non-in-domain categories
        result["checklist_F1"] = sum(result[f"F1_{c}"] for c in present) / len(present)
    return result


def gold_from_examples(df) -> dict:
    """Gold dict from a mrc.data examples table (answers already located and stripped)."""
    return {
        row.id: {
            "answers": [a["text"] for a in row.answers],
            "is_impossible": bool(row.is_impossible),
            "category": row.category or "",
        }
        for row in df.itertuples(index=False)
    }


def load_gold(path) -> dict:
    """Gold answers exactly as the official script reads them: raw answer texts, every question kept."""
    root = read_json(path)
    if not isinstance(root, dict) or not isinstance(root.get("data"), list):
        raise MRCError(f"{path}: expected a JSON object with a 'data' list (SQuAD format)")
    gold = OrderedDict()
    for doc in root["data"]:
        for para in doc.get("paragraphs", []) if isinstance(doc, dict) else []:
            for qa in para.get("qas", []) if isinstance(para, dict) else []:
                if not isinstance(qa, dict) or "id" not in qa:
                    raise MRCError(f"{path}: a question has no 'id'")
                qid = str(qa["id"])
                if qid in gold:
                    raise MRCError(f"{path}: id {qid}: duplicate id")
                impossible = qa.get("is_impossible", False)
                if isinstance(impossible, str):  # CAIL writes "true"/"false"
                    impossible = impossible.strip().lower() == "true"
                answers = qa.get("answers") or []
                if not isinstance(answers, list) or not all(isinstance(a, dict) and isinstance(a.get("text"), str) for a in answers):
                    raise MRCError(f"{path}: id {qid}: answers must be a list of {{'text': string}}")
                gold[qid] = {
                    "answers": [a["text"] for a in answers],
                    "is_impossible": bool(impossible),
                    "category": qa.get("type", "") or "",
                }
    if not gold:
        raise MRCError(f"{path}: no questions in the file")
    return gold


def load_predictions(path) -> dict:
    return check_predictions(read_json(path), where=str(path))
