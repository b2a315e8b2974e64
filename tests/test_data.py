"""The MRC reader: real files (counts), offset repair, and every bad-input case (strict and lenient)."""
import subprocess
import sys
import tarfile

import pytest
from conftest import ROOT, squad_json

from mrc import data
from mrc.data import load_file, load_sources, resolve_data_dir
from mrc.errors import MRCError

# source -> (questions, unanswerable, skipped) as read from the shared data dir
REAL_COUNTS = {
    "checklist_demo": (100, 51, 0),
    "checklist_dev": (568, 297, 0),
    "robust_demo": (100, 0, 0),
    "robust_dev": (1417, 0, 0),
    "cmrc2018_dev": (3219, 0, 0),
    "cmrc2018_trial": (1000, 0, 2),
    "drcd_dev": (3524, 0, 0),
    "drcd_test": (3493, 0, 0),
    "cail_dev": (5411, 1420, 589),
    "cail_test": (5423, 1462, 577),
    "squad2_zh": (9936, 5945, 0),
}


@pytest.mark.parametrize("source", sorted(REAL_COUNTS))
def test_real_files_read_with_expected_counts_and_exact_offsets(data_dir, source):
    df, report = load_file(data.source_path(source, data_dir), source=source)
    questions, unanswerable, skipped = REAL_COUNTS[source]
    assert (len(df), int(df["is_impossible"].sum()), report.total_skipped) == (questions, unanswerable, skipped)
    assert df["id"].is_unique
    for row in df.itertuples():
        assert row.is_impossible == (len(row.answers) == 0)
        for ans in row.answers:
            assert row.context[ans["answer_start"]:ans["answer_start"] + len(ans["text"])] == ans["text"]
            assert ans["text"] == ans["text"].strip()


def test_load_sources_prefixes_ids_and_keeps_categories(data_dir):
    df = load_sources(["checklist_dev", "checklist_demo"], data_dir=data_dir)
    assert df["id"].is_unique and df["id"].str.startswith(("checklist_dev:", "checklist_demo:")).all()
    assert set(df[df.source == "checklist_dev"]["category"]) >= {"in-domain", "phrase", "vocab_noun"}


def test_data_dir_resolution_order(monkeypatch, tmp_path):
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    assert resolve_data_dir() == tmp_path.resolve()
    assert resolve_data_dir(tmp_path / "x") == (tmp_path / "x").resolve()  # the flag wins


def one(context, **qa):
    qa = {"id": "q1", "question": "问题？", **qa}
    return squad_json([(context, [qa])])


def test_offset_repairs(write_json):
    ctx = "鲁滨逊漂流记的作者是 丹尼尔·笛福，他生于伦敦。"
    cases = {
        "minus_one": {"text": "伦敦", "answer_start": -1},
        "stray_space": {"text": " 丹尼尔·笛福", "answer_start": 10},
        "wrong_start": {"text": "伦敦", "answer_start": 3},
        "string_start": {"text": "伦敦", "answer_start": str(ctx.index("伦敦"))},
    }
    for name, answer in cases.items():
        df, report = load_file(write_json(one(ctx, answers=[answer]), f"{name}.json"))
        (got,) = df.iloc[0]["answers"]
        assert ctx[got["answer_start"]:got["answer_start"] + len(got["text"])] == got["text"] == answer["text"].strip(), name
    df, report = load_file(write_json(one(ctx, answers=[{"text": "伦敦", "answer_start": 22}, {"text": "伦敦", "answer_start": -1}])))
    assert len(df.iloc[0]["answers"]) == 1  # duplicate answers collapse


def test_quirks_string_booleans_yes_no_and_empty_answer_lists(write_json):
    ctx = "原告与被告于2010年结婚。"
    doc = squad_json([(ctx, [
        {"id": "s", "question": "何时结婚？", "is_impossible": "false", "answers": [{"text": "2010年", "answer_start": 6}]},
        {"id": "t", "question": "为何离婚？", "is_impossible": "true", "answers": [{"text": "", "answer_start": -1}]},
        {"id": "yn", "question": "是否结婚？", "is_impossible": "false", "answers": [{"text": "YES", "answer_start": -1}]},
        {"id": "sq", "question": "哪年？", "is_impossible": True, "answers": []},
        {"id": "mixed", "question": "何时？", "answers": [{"text": "NO", "answer_start": -1}, {"text": "2010年", "answer_start": 6}]},
    ])])
    df, report = load_file(write_json(doc))
    rows = df.set_index("id")
    assert list(rows.index) == ["s", "t", "sq", "mixed"]
    assert not rows.loc["s", "is_impossible"] and rows.loc["t", "is_impossible"] and rows.loc["sq", "is_impossible"]
    assert rows.loc["mixed", "answers"] == [{"text": "2010年", "answer_start": 6}]
    assert report.skipped == {"yes/no answer": 1}


def test_emoji_rare_cjk_and_long_passages_keep_offsets(write_json):
    ctx = "😀表情在前，𠀀字罕见，答案是𪚥龘。" + "长" * 100_000 + "结尾答案"
    doc = squad_json([(ctx, [
        {"id": "e", "question": "答案？", "answers": [{"text": "𪚥龘", "answer_start": -1}]},
        {"id": "l", "question": "结尾？", "answers": [{"text": "结尾答案", "answer_start": len(ctx) - 4}]},
    ])])
    df, _ = load_file(write_json(doc))
    for row in df.itertuples():
        a = row.answers[0]
        assert row.context[a["answer_start"]:a["answer_start"] + len(a["text"])] == a["text"]
    assert df.iloc[0]["answers"][0]["answer_start"] == ctx.index("𪚥龘")


BAD_FILES = {
    # name: (file content, message fragment, skipped in lenient mode?)
    "malformed_json": ('{"data": [', "malformed JSON", None),
    "truncated_json": ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "x"', "malformed JSON", None),
    "wrong_top_level": ("[1, 2, 3]", "expected a JSON object with a 'data' list", None),
    "no_data_key": ('{"version": "1"}', "expected a JSON object with a 'data' list", None),
    "empty_file": ("", "malformed JSON", None),
    "no_questions": ('{"data": []}', "no questions", None),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_files_fail_with_one_line_naming_the_file(write_json, name):
    content, fragment, _ = BAD_FILES[name]
    path = write_json(content, f"{name}.json")
    for strict in (False, True):
        with pytest.raises(MRCError) as err:
            load_file(path, strict=strict)
        assert str(path) in str(err.value) and fragment in str(err.value) and "\n" not in str(err.value)


def test_non_utf8_bytes(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes('{"data": [{"paragraphs": [{"context": "caf\xe9", "qas": []}]}]}'.encode("latin-1"))
    with pytest.raises(MRCError, match="not UTF-8"):
        load_file(path)


BAD_QUESTIONS = {
    # name: (context, qa, reason)
    "missing_id": ("北京", {"question": "哪？", "answers": []}, "missing key"),
    "missing_question": ("北京", {"id": "q1", "answers": []}, "missing key"),
    "non_string_question": ("北京", {"id": "q1", "question": 5, "answers": []}, "wrong type"),
    "non_string_id": ("北京", {"id": ["q"], "question": "哪？", "answers": []}, "wrong type"),
    "empty_question": ("北京", {"id": "q1", "question": "  ", "answers": []}, "empty question"),
    "empty_context": ("", {"id": "q1", "question": "哪？", "answers": []}, "empty context"),
    "answer_not_in_context": ("北京", {"id": "q1", "question": "哪？", "answers": [{"text": "上海", "answer_start": 0}]}, "answer not in context"),
    "answers_not_a_list": ("北京", {"id": "q1", "question": "哪？", "answers": "北京"}, "wrong type"),
    "answer_without_text": ("北京", {"id": "q1", "question": "哪？", "answers": [{"answer_start": 0}]}, "missing key"),
    "non_string_answer": ("北京", {"id": "q1", "question": "哪？", "answers": [{"text": 1, "answer_start": 0}]}, "wrong type"),
    "bad_answer_start": ("北京", {"id": "q1", "question": "哪？", "answers": [{"text": "北京", "answer_start": 1.5}]}, "wrong type"),
    "answer_start_out_of_range": ("北京", {"id": "q1", "question": "哪？", "answers": [{"text": "上", "answer_start": 99}]}, "answer not in context"),
    "bad_is_impossible": ("北京", {"id": "q1", "question": "哪？", "is_impossible": "maybe", "answers": []}, "wrong type"),
}


@pytest.mark.parametrize("name", sorted(BAD_QUESTIONS))
def test_bad_questions_strict_raises_lenient_skips_and_counts(write_json, name):
    context, qa, reason = BAD_QUESTIONS[name]
    good = {"id": "ok", "question": "好？", "answers": [{"text": "好", "answer_start": 0}]}
    path = write_json(squad_json([(context, [qa]), ("好的", [good])]), f"{name}.json")
    with pytest.raises(MRCError) as err:
        load_file(path, strict=True)
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    if "id" in qa and isinstance(qa["id"], str):
        assert f"id {qa['id']}" in message
    df, report = load_file(path)
    assert list(df["id"]) == ["ok"] and report.skipped == {reason: 1}


def test_duplicate_ids(write_json):
    qa = {"id": "dup", "question": "哪？", "answers": [{"text": "北京", "answer_start": 0}]}
    path = write_json(squad_json([("北京", [qa]), ("北京大学", [qa])]))
    with pytest.raises(MRCError, match="id dup: duplicate id"):
        load_file(path, strict=True)
    df, report = load_file(path)
    assert len(df) == 1 and report.skipped == {"duplicate id": 1}


def test_prediction_inputs_without_answers_are_kept(write_json):
    df, report = load_file(write_json(squad_json([("北京", [{"id": "t1", "question": "哪？"}])])))
    assert len(df) == 1 and df.iloc[0]["answers"] == [] and not df.iloc[0]["is_impossible"]
    assert len(data.labelled(df)) == 0  # not a training target


def test_data_stage_prints_counts(data_dir):
    out = subprocess.run([sys.executable, str(ROOT / "src" / "data_stats.py"), "--data_dir", str(data_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.startswith("cail_dev"))
    assert line.split()[1:5] == ["5411", "3991", "1420", "589"] and "yes/no answer 589" in line


def test_download_unpacks_a_local_tarball_and_fails_offline_in_one_line(tmp_path):
    inner = tmp_path / "src" / "dataset"
    inner.mkdir(parents=True)
    for name in ("train.json", "dev.json", "test1.json"):
        (inner / name).write_text('{"data": []}', encoding="utf-8")
    archive = tmp_path / "dureader_checklist.dataset.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(inner, arcname="dataset")
    dest = tmp_path / "data"
    script = str(ROOT / "src" / "download.py")
    out = subprocess.run([sys.executable, script, "--archive", str(archive), "--dest", str(dest)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("train.json", "dev.json", "test1.json"):
        assert (dest / "mrc" / "dureader_checklist" / name).read_text() == '{"data": []}'
    out = subprocess.run([sys.executable, script, "--url", "http://127.0.0.1:9/none.tar.gz", "--dest", str(dest), "--timeout", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.startswith("error:") and len(out.stderr.strip().splitlines()) == 1
    assert not (dest / "dureader_checklist.dataset.tar.gz").exists()
