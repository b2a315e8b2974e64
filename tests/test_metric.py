"""The official DuReader-checklist metric on hand-made cases, the CLI, and dev_public's no-answer score."""
import json
import subprocess
import sys

import pytest
from conftest import ROOT, squad_json

from mrc.errors import MRCError
from mrc.metric import evaluate, exact_match, f1_score, normalize, score_one, tokenize


def test_cjk_characters_are_tokens_and_other_runs_are_one_token():
    assert tokenize("北京2010年abc def") == ["北", "京", "2010", "年", "abc def"]
    assert tokenize("a=b") == ["a", "=", "b"]
    assert tokenize("𠀀中") == ["𠀀", "中"]  # CJK extension B counts as CJK


def test_f1_is_longest_contiguous_common_run():
    assert f1_score("北京", ["北京大学"]) == pytest.approx(2 / 3)  # P=1, R=1/2
    assert f1_score("甲丙", ["甲乙丙丁"]) == pytest.approx(1 / 3)  # contiguous run 1, not subsequence 2
    # a digit run is one token: 2011 vs 2010 share nothing but 年
    assert f1_score("2011年", ["2010年"]) == pytest.approx(0.5)
    assert f1_score("new", ["New York"]) == 0.0  # 'new york' is one token
    assert f1_score("完全无关", ["北京"]) == 0.0
    assert f1_score("北京", ["上海", "北京"]) == 1.0  # max over gold answers


def test_normalisation_removes_only_the_official_punctuation_and_lowercases():
    assert normalize("《红楼梦》，ABC") == "红楼梦abc"
    assert exact_match("红楼梦", ["《红楼梦》"]) == 1.0
    assert exact_match("ABC", ["abc"]) == 1.0
    assert exact_match("35", ["3.5"]) == 0.0  # '.' is not in the official list
    assert exact_match("a-b", ["ab"]) == 0.0  # nor is '-'
    assert normalize("好……") == "好……"  # the official '……' entry never matches one character


def test_no_answer_scoring():
    impossible = {"answers": [], "is_impossible": True, "category": ""}
    assert score_one("no answer", impossible) == (1.0, 1.0)
    assert score_one("No Answer", impossible) == (1.0, 1.0)  # lower() only
    assert score_one("no answer ", impossible) == (0.0, 0.0)  # no strip
    assert score_one("北京", impossible) == (0.0, 0.0)
    answerable = {"answers": ["北京"], "is_impossible": False, "category": ""}
    assert score_one("no answer", answerable) == (0.0, 0.0)


def test_evaluate_micro_average_skip_and_categories():
    gold = {
        "a": {"answers": ["北京大学"], "is_impossible": False, "category": "in-domain"},
        "b": {"answers": [], "is_impossible": True, "category": "vocab_noun"},
        "c": {"answers": ["上海"], "is_impossible": False, "category": "vocab_adj"},
        "d": {"answers": ["广州"], "is_impossible": False, "category": "reasoning_negative"},
    }
    result = evaluate(gold, {"a": "北京", "b": "no answer", "c": "上海"})
    assert result["TOTAL"] == 4 and result["SKIP"] == 1
    assert result["F1"] == pytest.approx(100 * (2 / 3 + 1 + 1 + 0) / 4)
    assert result["EM"] == pytest.approx(50.0)
    assert result["F1_vocab"] == pytest.approx(100.0) and result["N_vocab"] == 2
    assert result["F1_reasoning"] == 0.0
    assert result["checklist_F1"] == pytest.approx(50.0)  # mean of vocab 100 and reasoning 0
    assert evaluate(gold, {"a": "北京大学"}, tag="in-domain")["F1"] == 100.0


def test_bad_predictions_are_one_clear_error():
    gold = {"a": {"answers": ["x"], "is_impossible": False, "category": ""}}
    with pytest.raises(MRCError, match="JSON object"):
        evaluate(gold, ["x"])
    with pytest.raises(MRCError, match="id a: answer must be a string"):
        evaluate(gold, {"a": 3})


def _run_evaluate(*args):
    return subprocess.run([sys.executable, str(ROOT / "src" / "evaluate.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_one_json_line_and_fails_cleanly(write_json):
    gold = write_json(squad_json([("北京大学在北京。", [
        {"id": "q1", "question": "哪?", "answers": [{"text": "北京大学", "answer_start": 0}], "type": "phrase"},
        {"id": "q2", "question": "谁?", "answers": [{"text": "", "answer_start": -1}], "is_impossible": True, "type": "phrase"},
    ])]), "gold.json")
    pred = write_json({"q1": "北京大学", "q2": "no answer"}, "pred.json")
    out = _run_evaluate(gold, pred)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["F1"] == 100.0 and result["EM"] == 100.0 and result["TOTAL"] == 2 and result["SKIP"] == 0
    assert result["F1_phrase"] == 100.0 and result["checklist_F1"] == 100.0
    bad = write_json('["not", "an", "object"]', "bad.json")
    out = _run_evaluate(gold, bad)
    assert out.returncode == 1 and out.stderr.strip().startswith("error:") and "Traceback" not in out.stderr
    truncated = write_json('{"q1": "北京', "trunc.json")
    out = _run_evaluate(gold, truncated)
    assert out.returncode == 1 and "malformed JSON" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_all_no_answer_on_dev_public_scores_its_unanswerable_share(data_dir, tmp_path):
    gold_path = data_dir / "mrc" / "dureader_checklist" / "dev_public.json"
    gold = json.loads(gold_path.read_text(encoding="utf-8"))
    ids = [(qa["id"], qa["is_impossible"]) for doc in gold["data"] for p in doc["paragraphs"] for qa in p["qas"]]
    share = 100.0 * sum(imp for _, imp in ids) / len(ids)
    pred = tmp_path / "pred.json"
    pred.write_text(json.dumps({qid: "no answer" for qid, _ in ids}), encoding="utf-8")
    out = _run_evaluate(gold_path, pred)
    result = json.loads(out.stdout)
    assert result["TOTAL"] == 568
    assert result["F1"] == result["EM"] == pytest.approx(share, abs=1e-3) == pytest.approx(52.289, abs=1e-3)
    assert result["checklist_F1"] == pytest.approx(43.495, abs=1e-3)
