"""Report: table (markdown + CSV) and chart from experiments' cv.json and ensembles' result.json."""
import csv
import json
import os

import pytest

from mrc import metric
from mrc.errors import MRCError

LEADERBOARD = ["F1", "EM", "in-domain F1", "checklist F1", "vocab F1", "phrase F1", "semantic-role F1",
               "fault-tolerant F1", "reasoning F1"]


def gold_and_predictions():
    """Four questions over two categories; the metric gives the result dicts the files hold."""
    gold = {"a": {"answers": ["北京"], "is_impossible": False, "category": "in-domain"},
            "b": {"answers": [], "is_impossible": True, "category": "in-domain"},
            "c": {"answers": ["上海"], "is_impossible": False, "category": "vocab_noun"},
            "d": {"answers": [], "is_impossible": True, "category": "reasoning_negative"}}
    return gold, {"a": "北京", "b": "no answer", "c": "上海市", "d": "上海"}


@pytest.fixture
def outputs(tmp_path, write_json):
    gold, pred = gold_and_predictions()
    result = metric.evaluate(gold, pred)
    none = metric.evaluate(gold, {i: "no answer" for i in gold})
    out = tmp_path / "outputs"
    for exp in ("bert", "ernie"):
        (out / exp).mkdir(parents=True)
        (out / exp / "cv.json").write_text(json.dumps({"cv": result, "cv_all_no_answer": none, "dev": result, "dev_all_no_answer": none}))
    (out / "ensemble" / "ens").mkdir(parents=True)
    (out / "ensemble" / "ens" / "result.json").write_text(json.dumps(
        {"cv": result, "cv_all_no_answer": none, "test": result, "test_all_no_answer": none, "is_dev_public": True}))
    return out, result, none


def read_csv(path):
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_report_files_have_the_leaderboard_columns(outputs, tmp_path):
    import report

    out, result, none = outputs
    report.main(["--output_dir", str(out), "--data_dir", str(tmp_path / "no_data")])
    rows = read_csv(out / "report" / "report.csv")
    assert list(rows[0].keys()) == ["name", "kind", "split", "questions"] + LEADERBOARD
    keyed = {(r["name"], r["split"]): r for r in rows}
    assert len(keyed) == len(rows)  # no duplicate rows (e.g. the same baseline from several files)
    assert set(keyed) == {("no answer everywhere", "CV"), ("no answer everywhere", "dev_public"), ("bert", "CV"),
                          ("bert", "dev_public"), ("ernie", "CV"), ("ernie", "dev_public"), ("ens", "CV"), ("ens", "dev_public")}
    bert = keyed[("bert", "dev_public")]
    assert float(bert["F1"]) == pytest.approx(result["F1"], abs=1e-3)
    assert float(bert["in-domain F1"]) == pytest.approx(result["F1_in-domain"], abs=1e-3)
    assert float(bert["vocab F1"]) == pytest.approx(result["F1_vocab"], abs=1e-3)
    assert float(bert["checklist F1"]) == pytest.approx(result["checklist_F1"], abs=1e-3)
    assert bert["phrase F1"] == ""  # no question of that category: empty, not 0
    assert float(keyed[("no answer everywhere", "dev_public")]["F1"]) == pytest.approx(none["F1"])
    md = (out / "report" / "report.md").read_text(encoding="utf-8")
    assert "| name | kind | split | questions | " + " | ".join(LEADERBOARD) + " |" in md
    assert md.count("| bert |") == 2 and "| ens | ensemble | dev_public |" in md
    png = (out / "report" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_report_names_a_missing_experiment(outputs, tmp_path):
    import report

    out, _, _ = outputs
    with pytest.raises(MRCError, match="roberta/cv.json: not found"):
        report.main(["--output_dir", str(out), "--exps", "roberta", "--data_dir", str(tmp_path)])
    with pytest.raises(MRCError, match="no finished experiment"):
        report.main(["--output_dir", str(tmp_path / "empty"), "--data_dir", str(tmp_path)])


def test_report_dev_public_baseline_from_the_gold_file(outputs, data_dir):
    import report

    out, _, _ = outputs
    rows = report.collect_rows(out, ["bert"], [], data_dir)
    full = [r for r in rows if r["name"] == "no answer everywhere" and r["questions"] == 568]
    assert len(full) == 1 and full[0]["F1"] == pytest.approx(52.289, abs=1e-3)  # the README's reference number
    assert full[0]["checklist F1"] == pytest.approx(43.495, abs=1e-3)


# ---------------------------------------------------------------- the main job (src/run_all.py)
FAKE_STAGE = r'''
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
stage, launched = Path(sys.argv[0]).stem, []
if stage == "launch":  # launch.py STAGE --nproc N --log_dir DIR <stage flags>
    stage, launched, argv = argv[0], ["@launch", argv[argv.index("--nproc") + 1]], argv[argv.index("--log_dir") + 2:]
opt = lambda name, default=None: argv[argv.index(name) + 1] if name in argv else default
with open(os.environ["CALLS"], "a") as f:
    f.write(json.dumps([stage] + argv + launched) + "\n")
if stage == "pretrain":
    Path(opt("--output")).mkdir(parents=True, exist_ok=True)
    (Path(opt("--output")) / "metrics.json").write_text("{}")
elif stage == "train":
    if opt("--model") == os.environ.get("FAIL_MODEL"):
        print("error: boom", file=sys.stderr)
        sys.exit(1)
    exp = Path(opt("--output_dir")) / opt("--exp")
    exp.mkdir(parents=True, exist_ok=True)
    dev = {"F1": 60.0, "EM": 50.0, "TOTAL": 568}
    none = {"F1": 52.289, "EM": 52.289, "TOTAL": 568}
    (exp / "cv.json").write_text(json.dumps({"cv": dev, "dev": dev, "cv_all_no_answer": none, "dev_all_no_answer": none}))
elif stage == "ensemble":
    members = argv[argv.index("--exps") + 1: argv.index("--input")]
    res = Path(opt("--output_dir")) / "ensemble" / opt("--name") / "result.json"
    res.parent.mkdir(parents=True, exist_ok=True)
    sub = Path(opt("--submissions_dir")) / (opt("--name") + ".json")
    sub.parent.mkdir(parents=True, exist_ok=True)
    sub.write_text("{}")
    res.write_text(json.dumps({"members": members, "weights": [1 / len(members)] * len(members), "submission": str(sub),
                               "threshold": {"mode": "prob", "threshold": 0.5}, "cv": {"F1": 61.0},
                               "test": {"F1": 63.0, "EM": 55.0, "TOTAL": 568}, "test_all_no_answer": {"F1": 52.289, "EM": 52.289, "TOTAL": 568}}))
'''


@pytest.fixture
def fake_job(tmp_path, monkeypatch):
    import run_all

    src = tmp_path / "src"
    src.mkdir()
    for stage in ("pretrain", "train", "ensemble", "report", "launch"):
        (src / f"{stage}.py").write_text(FAKE_STAGE)
    monkeypatch.setattr(run_all, "SRC", src)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("CALLS", str(calls))
    data = tmp_path / "data"
    (data / "mrc" / "dureader_checklist").mkdir(parents=True)
    (data / "mrc" / "dureader_checklist" / "dev_public.json").write_text("{}")
    argv = ["--budget_minutes", "60", "--output_dir", str(tmp_path / "out"), "--data_dir", str(data),
            "--submissions_dir", str(tmp_path / "subs")]

    def run(*extra):
        calls.unlink(missing_ok=True)
        code = run_all.main(argv + list(extra))
        lines = calls.read_text().splitlines() if calls.exists() else []
        return code, [json.loads(l) for l in lines]

    return run, tmp_path


def test_run_all_stages_budget_and_resume(fake_job, capsys):
    run, tmp = fake_job
    code, calls = run("--models", "bert", "ernie", "roberta", "--pretrain_share", "0.25")
    assert code == 0
    assert [c[0] for c in calls] == ["pretrain"] * 3 + ["train"] * 3 + ["ensemble", "report"]
    assert [c[c.index("--recipe") + 1] for c in calls[:3]] == ["bert", "ernie", "roberta"]
    assert [c[c.index("--exp") + 1] for c in calls[3:6]] == ["bert", "ernie", "roberta"]
    minutes = [float(c[c.index("--max_minutes") + 1]) for c in calls[:6]]
    # 60 min minus the 4.8 min reserve; each stage gets its share of what is left among the stages still
    # to run (a quarter of it for the 3 pre-trainings): the fake stages take no time, so unused time
    # flows on and the last stage gets all that is left
    assert minutes[0] == pytest.approx(55.2 * 0.25 / 3, abs=0.05)
    assert minutes[1] == pytest.approx(55.2 * (0.25 / 3) / (1 - 0.25 / 3), abs=0.05)
    assert minutes[3] == pytest.approx(55.2 * (0.75 / 3) / 0.75, abs=0.05)
    assert minutes[5] == pytest.approx(55.2, abs=0.05)
    assert all("--profile" in c and c[c.index("--profile") + 1] == "cpu" for c in calls[:6])
    # cpu profile: data parallel over every core (2 processes x 1 thread beat 1 x 2), unless --nproc 1
    cores = os.cpu_count()
    assert all((c[-2:] == ["@launch", str(cores)]) == (cores > 1) for c in calls[:6])
    summary = capsys.readouterr().out
    assert "ensemble ensemble_cpu" in summary and "no answer everywhere" in summary and "52.289" in summary
    assert (tmp / "out" / "run_all" / "summary.txt").read_text() in summary
    # a rerun skips every finished stage; the report is remade
    code, calls = run("--models", "bert", "ernie", "roberta", "--pretrain_share", "0.25")
    assert code == 0 and [c[0] for c in calls] == ["report"]
    assert "done before" in capsys.readouterr().out


def test_run_all_goes_on_without_a_failed_training(fake_job, monkeypatch, capsys):
    run, _ = fake_job
    monkeypatch.setenv("FAIL_MODEL", "ernie")
    code, calls = run("--models", "bert", "ernie", "roberta", "--skip_pretrain", "--nproc", "1")
    assert all("@launch" not in c for c in calls)
    assert code == 1 and "pretrain" not in [c[0] for c in calls]
    ensemble_call = next(c for c in calls if c[0] == "ensemble")
    assert ensemble_call[ensemble_call.index("--exps") + 1: ensemble_call.index("--input")] == ["bert", "roberta"]
    assert "FAILED (exit 1)" in capsys.readouterr().out


def test_run_all_default_is_one_backbone_without_pretraining(fake_job):
    run, _ = fake_job
    code, calls = run()
    assert code == 0 and [c[0] for c in calls] == ["train", "ensemble", "report"]
    assert calls[0][calls[0].index("--model") + 1] == "ernie" and float(calls[0][calls[0].index("--max_minutes") + 1]) == 55.2
