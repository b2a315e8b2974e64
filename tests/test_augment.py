"""Swap negatives (mrc.augment): checklist-style unanswerable copies of answerable questions."""
import random

import pandas as pd

from mrc import augment

QUESTIONS = [  # (question, title, passage): each question's place or topic occurs in its own passage only
    ("长沙社保交多少钱一个月", "长沙社保缴费标准", "长沙市灵活就业人员社保每月缴费基数为3368元。"),
    ("无锡社保个人交多少钱", "无锡社保", "无锡个人缴纳社保的比例为8%。"),
    ("北京到上海的高铁多长时间", "北京上海高铁", "北京到上海的高铁最快四个半小时。"),
    ("苹果手机怎么设置铃声", "苹果手机铃声", "打开苹果手机的设置,点击声音。"),
    ("宝宝肠胃不好喝什么奶粉", "宝宝奶粉", "肠胃不好的宝宝可以喝水解蛋白奶粉。"),
    ("杭州西湖门票多少钱", "西湖门票", "杭州西湖免费开放,不需要门票。"),
]


def table(n_copies=1):
    rows = []
    for copy in range(n_copies):
        for i, (q, t, c) in enumerate(QUESTIONS):
            start = c.find(c[:4])
            rows.append({"id": f"q{copy}_{i}", "source": "robust_dev", "title": t, "context": c, "question": q,
                         "answers": [{"text": c[:4], "answer_start": start}], "is_impossible": False,
                         "category": "", "passage_id": f"p{i}"})
    rows.append({"id": "u", "source": "squad2_zh", "title": "西湖", "context": "西湖在杭州。", "question": "西湖有多深",
                 "answers": [], "is_impossible": True, "category": "", "passage_id": "pu"})
    return pd.DataFrame(rows)


def changed_word(original: str, swapped: str) -> tuple[str, str]:
    """The differing middle of two strings (common prefix and suffix removed)."""
    p = 0
    while p < min(len(original), len(swapped)) and original[p] == swapped[p]:
        p += 1
    s = 0
    while s < min(len(original), len(swapped)) - p and original[-1 - s] == swapped[-1 - s]:
        s += 1
    return original[p:len(original) - s], swapped[p:len(swapped) - s]


def test_swapped_copies_ask_about_a_term_the_passage_and_title_lack():
    df = table()
    neg = augment.swap_negatives(df, 1.0, random.Random(0))
    by_id = df.set_index("id")
    assert len(neg) >= 4 and list(neg.columns) == list(df.columns)
    for _, row in neg.iterrows():
        assert row["id"].endswith(augment.SWAP_SUFFIX) and row["is_impossible"] and row["answers"] == []
        orig = by_id.loc[row["id"][: -len(augment.SWAP_SUFFIX)]]
        assert not orig["is_impossible"] and row["context"] == orig["context"] and row["title"] == orig["title"]
        old, new = changed_word(orig["question"], row["question"])
        assert old and new, (orig["question"], row["question"])
        assert new not in row["context"] and new not in row["title"]  # the look-alike is missing from both
        assert old in orig["context"] or old in orig["title"]  # the swapped term was one the passage or title names
    assert "u#swap" not in set(neg["id"])  # unanswerable questions are never copied


def test_swap_negatives_are_seeded_and_sized_by_the_share():
    df = table(n_copies=20)
    a = augment.swap_negatives(df, 0.5, random.Random(7))
    assert a.equals(augment.swap_negatives(df, 0.5, random.Random(7)))
    assert not a.equals(augment.swap_negatives(df, 0.5, random.Random(8)))
    assert 0.3 * 120 <= len(a) <= 0.5 * 120  # half the 120 answerable questions picked; a few may lack a swap
    assert augment.swap_negatives(df, 0.0, random.Random(7)).empty


def test_question_words_are_never_swapped():
    words = augment.tag_words("北京到上海的高铁多长时间")
    assert "".join(w for _, _, w, _ in words) == "北京到上海的高铁多长时间"
    assert not augment.swappable("多少", "m") and not augment.swappable("什么", "r") and not augment.swappable("京", "ns")
