"""End to end on real questions with the tiny profile: train (2 folds) -> files, threshold, CV; resume
skips finished folds; predict answers every id of a file; bad input is one clear error."""
import json
import re

import numpy as np
import pytest

import predict
import train
from mrc import postprocess, sampling
from mrc.errors import MRCError


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("outputs")
    args = ["--model", "ernie", "--profile", "tiny", "--exp", "t", "--output_dir", str(out), "--data_dir", str(data_dir)]
    assert train.main(args) == 0
    return out, args


def test_train_writes_folds_logits_threshold_and_cv(tiny_run):
    out, _ = tiny_run
    exp = out / "t"
    info = json.loads((exp / "train_info.json").read_text())
    cv = json.loads((exp / "cv.json").read_text())
    threshold = json.loads((exp / "threshold.json").read_text())
    assert info["backbone"]["kind"] == "random" and info["folds"] == 2
    assert threshold["mode"] in postprocess.MODES and np.isfinite(threshold["threshold"])
    assert threshold["feature_key"] == info["features"]["feature_key"]
    folds = (out / "folds_tiny.csv").read_text().splitlines()
    assert folds[0] == "id,fold" and len(folds) - 1 == info["train_questions"]
    fold_of = dict(line.split(",") for line in folds[1:])
    oof_ids = set()
    for k in range(2):
        fold = exp / f"fold{k}"
        metrics = json.loads((fold / "metrics.json").read_text())
        assert metrics["train_loss_last"] < metrics["train_loss_first"], "training loss must go down"
        oof = postprocess.load_logits(fold / "oof.npz")
        dev = postprocess.load_logits(fold / "dev.npz")
        assert oof["feature_key"] == dev["feature_key"] == info["features"]["feature_key"]
        ids = set(oof["example_id"].tolist())
        assert all(fold_of[i] == str(k) for i in ids)  # out-of-fold: only this fold's held-out questions
        oof_ids |= ids
        assert (fold / "model" / "model_state.pdparams").is_file() and not list(fold.glob("checkpoint-*"))
        assert oof["offsets"].shape[:2] == oof["start_logits"].shape and oof["answerable_logits"].shape[1] == 2
    assert oof_ids == set(fold_of)  # every training question has exactly one out-of-fold prediction
    assert cv["cv"]["TOTAL"] == info["train_questions"] and cv["dev"]["TOTAL"] == info["dev_questions"]
    assert cv["cv"]["F1"] >= cv["cv_all_no_answer"]["F1"] - 1e-9  # the tuned threshold can always say 'no answer'
    dev_pred = json.loads((exp / "dev_predictions.json").read_text())
    assert len(dev_pred) == info["dev_questions"]
    assert (exp / "config.yaml").is_file() and json.loads((exp / "metrics.json").read_text())["cv"] == cv["cv"]


def test_resume_skips_finished_folds_and_mismatched_folds_fail(tiny_run, caplog):
    out, args = tiny_run
    before = json.loads((out / "t" / "cv.json").read_text())
    with caplog.at_level("INFO", logger="mrc.train"):
        assert train.main(args) == 0
    assert sum("finished before" in r.getMessage() for r in caplog.records) == 2
    after = json.loads((out / "t" / "cv.json").read_text())
    assert after["cv"] == before["cv"] and after["dev"] == before["dev"]
    with pytest.raises(MRCError, match="folds"):
        train.main(args[:-4] + ["--exp", "t3", "--folds", "3"] + args[-4:])
    with pytest.raises(MRCError, match="unknown model"):
        train.main(["--model", "no-such-model-xyz", "--profile", "tiny", "--output_dir", str(out)])


def test_predict_answers_every_id(tiny_run, data_dir, tmp_path, capsys):
    out, _ = tiny_run
    source = json.loads((data_dir / "mrc" / "dureader_checklist" / "dev_public.json").read_text(encoding="utf-8"))
    paragraphs = [p for doc in source["data"] for p in doc["paragraphs"]][:12]
    paragraphs[0]["qas"].append({"id": "no-gold", "question": "这是什么", "answers": []})  # no gold: still answered
    path = tmp_path / "in.json"
    path.write_text(json.dumps({"data": [{"title": "", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")
    ids = [qa["id"] for p in paragraphs for qa in p["qas"]]
    pred_path, logits_path = tmp_path / "pred.json", tmp_path / "logits.npz"
    assert predict.main(["--exp", "t", "--input", str(path), "--output", str(pred_path), "--output_dir", str(out),
                         "--logits_out", str(logits_path)]) == 0
    pred = json.loads(pred_path.read_text(encoding="utf-8"))
    assert sorted(pred) == sorted(ids) and all(isinstance(v, str) and v for v in pred.values())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["TOTAL"] == len(ids) and 0 <= printed["F1"] <= 100
    assert set(postprocess.load_logits(logits_path)["example_id"].tolist()) == set(ids)
    # the exported static graphs (paddle.inference) give the same logits and answers, and are cached
    static_pred, static_logits = tmp_path / "static.json", tmp_path / "static.npz"
    assert predict.main(["--exp", "t", "--input", str(path), "--output", str(static_pred), "--output_dir", str(out),
                         "--logits_out", str(static_logits), "--static"]) == 0
    dynamic, static = postprocess.load_logits(logits_path), postprocess.load_logits(static_logits)
    for key in ("start_logits", "end_logits", "answerable_logits"):
        assert np.allclose(dynamic[key], static[key], atol=1e-3), key
    assert json.loads(static_pred.read_text(encoding="utf-8")) == pred
    assert (out / "t" / "fold0" / "inference").is_dir()
    # bfloat16 kernels: every id answered, logits near fp32 (bf16 keeps 8 bits of mantissa)
    bf16_pred, bf16_logits = tmp_path / "bf16.json", tmp_path / "bf16.npz"
    assert predict.main(["--exp", "t", "--input", str(path), "--output", str(bf16_pred), "--output_dir", str(out),
                         "--logits_out", str(bf16_logits), "--static", "--bf16"]) == 0
    assert sorted(json.loads(bf16_pred.read_text(encoding="utf-8"))) == sorted(ids)
    low = postprocess.load_logits(bf16_logits)
    real = static["start_logits"] > postprocess.PAD_LOGIT / 2
    assert np.abs(low["start_logits"] - static["start_logits"])[real].max() < 0.25
    assert np.abs(low["answerable_logits"] - static["answerable_logits"]).max() < 0.25
    with pytest.raises(MRCError, match="add --static"):
        predict.main(["--exp", "t", "--input", str(path), "--output", str(bf16_pred), "--output_dir", str(out), "--bf16"])
    with pytest.raises(MRCError, match=re.escape("no prediction")):
        predict.check_complete({ids[0]: "x"}, ids, "in.json")
    with pytest.raises(MRCError, match="train it first"):
        predict.main(["--exp", "nope", "--input", str(path), "--output", str(pred_path), "--output_dir", str(out)])


def test_time_budget_stops_training_but_still_writes_everything(tiny_run):
    out, args = tiny_run
    assert train.main(args[:4] + ["--exp", "budget", "--max_minutes", "0.01"] + args[6:]) == 0
    for k in range(2):
        metrics = json.loads((out / "budget" / f"fold{k}" / "metrics.json").read_text())
        assert metrics["stopped_by_time_budget"] and metrics["steps"] < metrics["steps_per_epoch"] * 4
        assert (out / "budget" / f"fold{k}" / "oof.npz").is_file()
    assert json.loads((out / "budget" / "cv.json").read_text())["cv"]["TOTAL"] > 0


def test_select_questions_keeps_the_demo_and_reaches_the_unanswerable_share():
    import pandas as pd

    rows = [{"id": f"d{i}", "source": "checklist_demo", "is_impossible": i % 2 == 0, "answers": [] if i % 2 == 0 else [{"text": "a"}]}
            for i in range(10)]
    rows += [{"id": f"s{i}", "source": "squad2_zh", "is_impossible": i % 4 == 0, "answers": [] if i % 4 == 0 else [{"text": "a"}]}
             for i in range(400)]
    df = pd.DataFrame(rows)
    half = sampling.select_questions(df, 100, seed=3, unanswerable_share=0.5)
    assert len(half) == 100 and half["is_impossible"].sum() == 50 and (half["source"] == "checklist_demo").sum() == 10
    assert half.equals(sampling.select_questions(df, 100, seed=3, unanswerable_share=0.5))  # seeded
    everything = sampling.select_questions(df, None, seed=3, unanswerable_share=0.5)  # 105 unanswerable: 210 questions
    assert len(everything) == 210 and everything["is_impossible"].mean() == 0.5
    repeated = sampling.repeat_sources(half, {"checklist_demo": 3})
    assert len(repeated) == 120 and (repeated["source"] == "checklist_demo").sum() == 30


def test_one_of_k_folds_with_match_types_and_the_stacker(tiny_run, data_dir, tmp_path):
    out = tmp_path / "outputs"  # its own folds file; the project vocab of the module's run
    out.mkdir()
    (out / "vocab").symlink_to(tiny_run[0] / "vocab")
    base = ["--model", "ernie", "--profile", "tiny", "--exp", "one", "--output_dir", str(out), "--data_dir", str(data_dir)]
    args = base + ["--folds", "3", "--train_folds", "1", "--match_types", "true", "--max_questions", "60", "--unanswerable_share", "0.5",
                   "--swap_negatives", "1.0"]
    assert train.main(args) == 0
    exp = out / "one"
    info = json.loads((exp / "train_info.json").read_text())
    assert info["trained_folds"] == [0] and not (exp / "fold1").exists() and info["features"]["match_types"]
    assert info["features"]["feature_key"].endswith("|match=1")
    cv = json.loads((exp / "cv.json").read_text())
    oof_ids = set(postprocess.load_logits(exp / "fold0" / "oof.npz")["example_id"].tolist())
    fold = json.loads((exp / "fold0" / "metrics.json").read_text())
    assert 0 < fold["swap_negatives"] and fold["train_questions"] == info["train_questions"] - fold["valid_questions"] + fold["swap_negatives"]
    assert not any(i.endswith("#swap") for i in oof_ids)  # swapped copies are training questions only
    assert cv["cv"]["TOTAL"] == len(oof_ids) < info["train_questions"]  # CV over the trained fold's held-out third
    assert "auc_prob" in cv["dev_diagnostics"] and 0 <= cv["dev_diagnostics"]["answerable_span_F1"] <= 100
    with pytest.raises(MRCError, match="train_folds"):
        train.main(base + ["--folds", "3", "--train_folds", "4"])
    with pytest.raises(MRCError, match="swap_negatives"):
        train.main(base + ["--swap_negatives", "1.5"])


def test_keep_negative_windows_keeps_answers_and_one_window_per_unanswerable_question():
    from mrc.features import Features

    f = Features(key="k")
    layout = [("a", 0), ("a", 1), ("a", 0), ("a", 0), ("u", 0), ("u", 0), ("u", 0)] * 20
    for n, (qid, ans) in enumerate(layout):
        f.input_ids.append(np.array([n]))
        for name in ("token_type_ids", "offsets", "example_index", "start_positions", "end_positions"):
            getattr(f, name).append(np.array([0]) if name != "example_index" else 2 * (n // 7) + (qid == "u"))
        f.example_id.append(f"{qid}{n // 7}")
        f.answerable.append(ans)
    kept = sampling.keep_negative_windows(f, 0.0, seed=1)
    assert sum(kept.answerable) == 20 and len(kept) == 40  # the answer windows + each unanswerable question's first
    assert all(kept.example_id[i].startswith("u") for i in range(len(kept)) if not kept.answerable[i])
    some = sampling.keep_negative_windows(f, 0.5, seed=1)
    assert 40 < len(some) < 100 and len(sampling.keep_negative_windows(f, 1.0, seed=1)) == len(f)
    assert [int(x[0]) for x in some.input_ids] == [int(x[0]) for x in sampling.keep_negative_windows(f, 0.5, seed=1).input_ids]


def cpu_config(*argv):
    return train.resolve_config(train.build_parser().parse_args(["--profile", "cpu", *argv]))


def test_a_longer_budget_scales_the_cpu_profiles_epochs():
    base = cpu_config()
    folds, sized_for = base["train_folds"], base["epochs_sized_for_minutes"]  # minutes of one fold; folds share the budget
    assert cpu_config("--max_minutes", str(folds * sized_for / 2))["epochs"] == base["epochs"]
    assert cpu_config("--max_minutes", str(folds * sized_for * 3))["epochs"] == pytest.approx(base["epochs"] * 3)
    assert cpu_config("--max_minutes", str(sized_for * 3), "--train_folds", "1")["epochs"] == pytest.approx(base["epochs"] * 3)
    assert cpu_config("--max_minutes", "500", "--epochs", "1")["epochs"] == 1  # an explicit --epochs wins


def test_a_short_budget_trains_fewer_folds():
    base = cpu_config()
    per_fold = base["min_fold_minutes"]
    assert base["train_folds"] == 2  # no budget given: the profile's folds
    assert cpu_config("--max_minutes", str(2 * per_fold))["train_folds"] == 2
    assert cpu_config("--max_minutes", str(2 * per_fold - 1))["train_folds"] == 1
    assert cpu_config("--max_minutes", "5")["train_folds"] == 1  # never fewer than one
    assert cpu_config("--max_minutes", "500")["train_folds"] == 2  # never more than the profile's
    assert cpu_config("--max_minutes", "5", "--train_folds", "2")["train_folds"] == 2  # an explicit --train_folds wins


def test_bad_post_expand_to_fails_when_the_config_is_read(tmp_path):
    config = tmp_path / "train.yaml"
    text = (train.REPO_ROOT / "configs" / "train.yaml").read_text(encoding="utf-8")
    config.write_text(text.replace("expand_to: null", "expand_to: paragraph"), encoding="utf-8")
    with pytest.raises(MRCError, match="expand_to 'paragraph'"):
        train.resolve_config(train.build_parser().parse_args(["--profile", "tiny", "--config", str(config)]))
    tiny = train.resolve_config(train.build_parser().parse_args(["--profile", "tiny"]))
    assert tiny["post"]["expand_to"] is None  # the shared default
    cpu = train.resolve_config(train.build_parser().parse_args(["--profile", "cpu"]))
    assert cpu["post"]["expand_to"] == "clause" and cpu["post"]["n_best"] == tiny["post"]["n_best"]  # one key changed


def test_train_sources_from_the_profile_or_the_flag_never_an_evaluation_set():
    cfg = lambda *argv: train.resolve_config(train.build_parser().parse_args(list(argv)))  # noqa: E731
    every = train.load_yaml_config("configs/default.yaml")["train_sources"]
    assert cfg("--profile", "tiny")["train_sources"] == every  # no profile choice: every set
    cpu = cfg("--profile", "cpu")["train_sources"]
    assert "squad2_zh" in cpu and not {"cail_dev", "cail_test", "drcd_dev", "drcd_test"} & set(cpu)  # the DuReader-family mix
    assert cfg("--profile", "cpu", "--train_sources", "robust_dev, squad2_zh")["train_sources"] == ["robust_dev", "squad2_zh"]
    with pytest.raises(MRCError, match="unknown set robust_train"):
        cfg("--profile", "cpu", "--train_sources", "robust_dev,robust_train")
    with pytest.raises(MRCError, match="checklist_dev is evaluation data"):
        cfg("--profile", "cpu", "--train_sources", "squad2_zh,checklist_dev")
    with pytest.raises(MRCError, match="empty"):
        cfg("--profile", "cpu", "--train_sources", ",")


def test_headroom_of_a_trained_run(tiny_run, capsys):
    import headroom

    out, _ = tiny_run
    assert headroom.main(["--exp", "t", "--output_dir", str(out)]) == 0
    result = json.loads((out / "t" / "headroom.json").read_text(encoding="utf-8"))
    assert result["questions"] == 16 and result["run_F1"] is not None
    assert result["spans"]["best_sentence"] >= result["spans"]["first_sentence"]
    for row in result["best_F1"].values():  # a threshold may answer nothing: never below 'no answer' everywhere
        assert all(f1 >= result["no_answer_F1"] - 1e-9 for f1, _ in row.values())
    assert "| decision value | AUC |" in capsys.readouterr().out
    with pytest.raises(MRCError, match="go together"):
        headroom.main(["--exp", "t", "--output_dir", str(out), "--input", "x.json"])
    with pytest.raises(MRCError, match="train it first"):
        headroom.main(["--exp", "nope", "--output_dir", str(out)])
