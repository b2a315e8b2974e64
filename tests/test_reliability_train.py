"""Reliability of train/predict on real questions (tiny profile): a run killed with SIGKILL resumes and
ends exactly as an uninterrupted one; same seed, same bytes; nothing half-written survives; a NaN loss
stops the run naming the step and batch; bad inputs end in one `error:` line, never a traceback."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import predict
import train
from mrc import postprocess, runtime
from mrc.data import load_sources
from mrc.errors import MRCError
from mrc.finetune import CHECKPOINT_DONE
from mrc.vocab import build_vocab

ROOT = Path(__file__).resolve().parents[1]
# 2 epochs of the tiny profile: ~18 steps per fold, a checkpoint every 5
TRAIN_FLAGS = ["--model", "bert", "--profile", "tiny", "--epochs", "2", "--seed", "7"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, data_dir):
    """A config whose tiny profile reads only the checklist demo (what the tiny profile selects anyway,
    without loading every training set) and a small project vocab, so each run takes seconds."""
    base = tmp_path_factory.mktemp("reliability")
    cfg = yaml.safe_load((ROOT / "configs" / "train.yaml").read_text(encoding="utf-8"))
    cfg["train_sources"] = ["checklist_demo"]
    config = base / "train.yaml"
    config.write_text(yaml.safe_dump(cfg, allow_unicode=True), encoding="utf-8")
    df = load_sources(["checklist_demo", "checklist_dev"], data_dir)
    vocab = build_vocab(list(df["context"].unique()) + df["question"].tolist() + df["title"].tolist(), base / "vocab")
    return {"base": base, "config": config, "vocab": vocab, "data_dir": data_dir}


def new_output_root(setup, name) -> Path:
    out = setup["base"] / name
    shutil.copytree(setup["vocab"], out / "vocab")  # the random-init backbone's vocab (outputs/vocab)
    return out


def train_args(setup, out, exp="r") -> list[str]:
    return TRAIN_FLAGS + ["--exp", exp, "--output_dir", str(out), "--data_dir", str(setup["data_dir"]),
                          "--config", str(setup["config"])]


def write_input(path: Path, data_dir: Path, n_paragraphs=6, extra_qas=()) -> list[str]:
    source = json.loads((data_dir / "mrc" / "dureader_checklist" / "dev_public.json").read_text(encoding="utf-8"))
    paragraphs = [p for doc in source["data"] for p in doc["paragraphs"]][:n_paragraphs]
    paragraphs[0]["qas"] = paragraphs[0]["qas"] + list(extra_qas)
    path.write_text(json.dumps({"data": [{"title": "", "paragraphs": paragraphs}]}, ensure_ascii=False), encoding="utf-8")
    return [qa["id"] for p in paragraphs for qa in p["qas"]]


def run_cli(main, argv, capsys):
    """An entry point as its CLI runs it (runtime.run_main): (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        runtime.run_main(lambda: main(argv))
    return exit_info.value.code, capsys.readouterr().err


def assert_one_error_line(code, err, *fragments):
    """Exit 1 and one `error:` line, the last of stderr (progress bars may come before it), no traceback."""
    lines = err.strip().splitlines()
    assert code == 1 and lines and lines[-1].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


def comparable_cv(exp_dir: Path) -> dict:
    """cv.json without wall-clock fields and paths."""
    cv = json.loads((exp_dir / "cv.json").read_text(encoding="utf-8"))
    cv.pop("wall_seconds")
    cv.pop("backbone")  # names the run's own vocab dir
    for fold in cv["folds"]:
        fold.pop("seconds")
        fold["best_checkpoint"] = Path(fold["best_checkpoint"]).name
    return cv


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted run (in this process)."""
    out = new_output_root(setup, "reference")
    assert train.main(train_args(setup, out)) == 0
    return out / "r"


def test_kill_9_during_train_resumes_to_the_same_result(setup, tmp_path):
    out = new_output_root(setup, "killed")
    cmd = [sys.executable, str(ROOT / "src" / "train.py")] + train_args(setup, out)
    # one thread in both runs: multi-threaded MKL reductions may differ in the last float digit
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MRC_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    reference_out = new_output_root(setup, "uninterrupted")
    uninterrupted = subprocess.Popen([sys.executable, str(ROOT / "src" / "train.py")] + train_args(setup, reference_out),
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    fold0 = out / "r" / "fold0"
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while not list(fold0.glob(f"checkpoint-*/{CHECKPOINT_DONE}")):
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.time() - t0 < 120, "no checkpoint within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (fold0 / "metrics.json").exists(), "killed too late: fold 0 had finished"
    # a checkpoint the kill left half-written (no completion mark) must not be resumed from
    (fold0 / "checkpoint-999").mkdir()
    (fold0 / "checkpoint-999" / "model_state.pdparams").write_bytes(b"half a file")

    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "fold 0: resuming from" in rerun.stderr and "checkpoint-999: incomplete checkpoint" in rerun.stderr
    resumed_step = int(rerun.stderr.split("fold 0: resuming from")[1].split("(step ")[1].split(")")[0])
    assert resumed_step >= 5
    resumed = out / "r"
    _, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err[-3000:]
    reference = reference_out / "r"
    assert comparable_cv(resumed) == comparable_cv(reference)
    for k in range(2):
        for name in ("oof.npz", "dev.npz"):
            a, b = postprocess.load_logits(reference / f"fold{k}" / name), postprocess.load_logits(resumed / f"fold{k}" / name)
            assert a.keys() == b.keys()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"fold{k}/{name}: {key}")
    assert not list(out.rglob("checkpoint-*")) and not list(out.rglob("*.tmp*"))


def test_same_seed_gives_byte_identical_predictions(setup, reference, tmp_path):
    out = new_output_root(setup, "again")
    assert train.main(train_args(setup, out)) == 0
    ids = write_input(tmp_path / "in.json", setup["data_dir"])
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for exp_dir, pred in ((reference, first), (out / "r", second)):
        assert predict.main(["--exp", "r", "--input", str(tmp_path / "in.json"), "--output", str(pred),
                             "--output_dir", str(exp_dir.parent)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert sorted(json.loads(first.read_text(encoding="utf-8"))) == sorted(ids)
    assert comparable_cv(out / "r") == comparable_cv(reference)


def test_no_tmp_files_and_failed_prediction_writes_nothing(setup, reference, tmp_path):
    assert not list(reference.parent.rglob("*.tmp*"))
    dup = {"id": "dup-1", "question": "一", "answers": []}
    write_input(tmp_path / "dup.json", setup["data_dir"], extra_qas=[dup, dict(dup, question="二")])
    output = tmp_path / "pred" / "out.json"
    with pytest.raises(MRCError, match="id dup-1: duplicate id"):
        predict.main(["--exp", "r", "--input", str(tmp_path / "dup.json"), "--output", str(output),
                      "--output_dir", str(reference.parent), "--logits_out", str(tmp_path / "pred" / "l.npz")])
    assert not output.exists() and not (tmp_path / "pred" / "l.npz").exists()
    assert not list(tmp_path.rglob("*.tmp*"))


def test_predict_answers_every_id_whatever_the_gold(setup, reference, tmp_path, capsys):
    """Gold answers do not matter for predicting: YES/NO (CAIL) and unlocatable answers are still answered,
    and the official metric is printed over every id."""
    extra = [{"id": "yes-no", "question": "是否成立", "answers": [{"text": "YES", "answer_start": -1}]},
             {"id": "elsewhere", "question": "在哪里", "answers": [{"text": "不在文中的答案", "answer_start": 3}]},
             {"id": "bad-gold", "question": "多少", "answers": [{"text": 5, "answer_start": 0}]}]
    ids = write_input(tmp_path / "in.json", setup["data_dir"], n_paragraphs=3, extra_qas=extra[:2])
    output = tmp_path / "out.json"
    assert predict.main(["--exp", "r", "--input", str(tmp_path / "in.json"), "--output", str(output),
                         "--output_dir", str(reference.parent)]) == 0
    pred = json.loads(output.read_text(encoding="utf-8"))
    assert sorted(pred) == sorted(ids) and all(isinstance(v, str) and v for v in pred.values())
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["TOTAL"] == len(ids)
    # gold the official reader rejects: predictions are still written, only the metric is left out
    ids = write_input(tmp_path / "in2.json", setup["data_dir"], n_paragraphs=2, extra_qas=extra[2:])
    assert predict.main(["--exp", "r", "--input", str(tmp_path / "in2.json"), "--output", str(output),
                         "--output_dir", str(reference.parent)]) == 0
    assert sorted(json.loads(output.read_text(encoding="utf-8"))) == sorted(ids)
    # a structural problem is one error naming the file and the id, and nothing is written
    write_input(tmp_path / "in3.json", setup["data_dir"], n_paragraphs=2, extra_qas=[{"id": "no-question", "question": " "}])
    code, err = run_cli(predict.main, ["--exp", "r", "--input", str(tmp_path / "in3.json"), "--output",
                                       str(tmp_path / "out3.json"), "--output_dir", str(reference.parent)], capsys)
    assert_one_error_line(code, err, str(tmp_path / "in3.json"), "id no-question", "empty question")
    assert not (tmp_path / "out3.json").exists()


def test_nan_loss_stops_the_run_naming_step_and_batch(setup, monkeypatch):
    """The 3rd training forward returns a NaN loss (evaluation forwards are not counted)."""
    from mrc import model as model_module

    forward, calls = model_module.SpanAnswerableModel.forward, []

    def poisoned(self, *args, **kwargs):
        outputs = forward(self, *args, **kwargs)
        if self.training and kwargs.get("start_positions") is not None:
            calls.append(1)
            if len(calls) == 3:
                return (outputs[0] * float("nan"),) + tuple(outputs[1:])
        return outputs

    monkeypatch.setattr(model_module.SpanAnswerableModel, "forward", poisoned)
    out = new_output_root(setup, "nan")
    with pytest.raises(MRCError, match=r"loss is nan at step 3, batch 3 of epoch 1 \(\d+ windows, first feature \d+, "
                                       r"question checklist_demo:\S+\): training diverged"):
        train.main(train_args(setup, out))
    assert not (out / "r" / "fold0" / "metrics.json").exists() and not (out / "r" / "cv.json").exists()


def test_bad_inputs_are_one_error_line(setup, reference, tmp_path, capsys):
    out = str(reference.parent)
    common = ["--profile", "tiny", "--output_dir", str(tmp_path / "o"), "--data_dir", str(setup["data_dir"]),
              "--config", str(setup["config"])]
    code, err = run_cli(train.main, ["--model", "no-such-model-xyz"] + common, capsys)
    assert_one_error_line(code, err, "unknown model 'no-such-model-xyz'")
    code, err = run_cli(train.main, ["--model", "./nope"] + common, capsys)
    assert_one_error_line(code, err, "./nope", "checkpoint directory not found")
    code, err = run_cli(train.main, ["--dropout", "1.5"] + common, capsys)
    assert_one_error_line(code, err, "--dropout 1.5", "must be in [0, 1)")
    bad_share = tmp_path / "bad_share.yaml"  # refused before any training, not after it
    bad_share.write_text(Path(setup["config"]).read_text(encoding="utf-8") + "\ntarget_unanswerable_share: 1.5\n", encoding="utf-8")
    code, err = run_cli(train.main, ["--exp", "bad_share"] + common[:-1] + [str(bad_share)], capsys)
    assert_one_error_line(code, err, "target_unanswerable_share 1.5", "strictly between 0 and 1")
    assert not (tmp_path / "o" / "bad_share").exists()

    # a checkpoint dir with a real config and tokenizer but garbage weights
    corrupt = tmp_path / "corrupt"
    shutil.copytree(setup["vocab"], corrupt)
    (corrupt / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 100,
                                                     "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                                                     "intermediate_size": 64}), encoding="utf-8")
    (corrupt / "model_state.pdparams").write_bytes(b"\x00garbage" * 100)
    code, err = run_cli(train.main, ["--model", str(corrupt), "--exp", "corrupt"] + common, capsys)
    assert_one_error_line(code, err, str(corrupt), "cannot load")

    # predict: a fold model with garbage weights, an experiment that does not exist, bad input files
    exp_copy = tmp_path / "outs" / "r"
    shutil.copytree(reference, exp_copy)
    weights = exp_copy / "fold1" / "model" / "model_state.pdparams"
    weights.write_bytes(b"\x00garbage" * 100)
    ids_file = tmp_path / "in.json"
    write_input(ids_file, setup["data_dir"], n_paragraphs=2)
    pred = tmp_path / "pred.json"
    code, err = run_cli(predict.main, ["--exp", "r", "--input", str(ids_file), "--output", str(pred),
                                       "--output_dir", str(tmp_path / "outs")], capsys)
    assert_one_error_line(code, err, str(weights), "cannot read the weights")
    code, err = run_cli(predict.main, ["--exp", "does-not-exist", "--input", str(ids_file), "--output", str(pred),
                                       "--output_dir", out], capsys)
    assert_one_error_line(code, err, "does-not-exist", "train it first")
    for name, text, says in [("malformed.json", '{"data": [', "malformed JSON"), ("empty.json", "", "malformed JSON"),
                             ("list.json", "[1, 2]", "expected a JSON object with a 'data' list"),
                             ("nodata.json", '{"version": "1"}', "expected a JSON object with a 'data' list"),
                             ("noquestions.json", '{"data": []}', "no questions")]:
        bad = tmp_path / name
        bad.write_text(text, encoding="utf-8")
        code, err = run_cli(predict.main, ["--exp", "r", "--input", str(bad), "--output", str(pred), "--output_dir", out], capsys)
        assert_one_error_line(code, err, str(bad), says)
    assert not pred.exists() and not list(tmp_path.rglob("*.tmp*"))


def test_bad_input_through_the_real_cli_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run([sys.executable, str(ROOT / "src" / "predict.py"), "--exp", "missing-exp", "--input", str(bad),
                             "--output", str(tmp_path / "p.json"), "--output_dir", str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "p.json").exists()


def test_batch_sampler_shards_the_same_global_batches_across_ranks(monkeypatch):
    from mrc.finetune import LengthBucketBatchSampler

    lengths = [(i * 37) % 50 + 5 for i in range(45)]  # 45 windows, batch 4 -> 12 global batches
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    monkeypatch.delenv("PADDLE_TRAINERS_NUM", raising=False)
    single = LengthBucketBatchSampler(lengths, 4, seed=3)
    single.set_epoch(1)
    global_batches = single.batches()
    assert len(single) == len(global_batches) == 12 and sorted(sum(global_batches, [])) == list(range(45))
    shares = []
    for rank in range(3):
        monkeypatch.setenv("PADDLE_TRAINER_ID", str(rank))
        monkeypatch.setenv("PADDLE_TRAINERS_NUM", "3")
        sampler = LengthBucketBatchSampler(lengths, 4, seed=3)
        sampler.set_epoch(1)
        shares.append(list(sampler))
        assert len(sampler) == len(shares[-1]) == 4  # every rank the same number of steps
    # rank r takes global batches r, r+3, ...: together exactly the single-process batches
    assert [shares[i % 3][i // 3] for i in range(12)] == global_batches


def test_time_budget_reserve_moves_the_deadline_and_default_is_unchanged():
    from paddlenlp.trainer import TrainerControl, TrainerState

    from mrc.callbacks import TimeBudget
    from mrc.finetune import InferenceReserve

    state, now = TrainerState(), time.time()
    state.global_step, state.max_steps = 3, 10
    plain = TimeBudget(now + 60)  # pre-training's use: no reserve, no evaluation
    control = plain.on_step_end(None, state, TrainerControl())
    assert not control.should_training_stop and not plain.stopped_early
    reserve = InferenceReserve(n_infer=1000, default_seconds_per_window=0.1)  # 1.2 * 100 s > 60 s left
    budget = TimeBudget(now + 60, eval_at_end=True, reserve=reserve)
    assert budget.deadline == pytest.approx(now + 60 - 120)
    control = budget.on_step_end(None, state, TrainerControl())
    assert control.should_training_stop and control.should_save and control.should_evaluate and budget.stopped_early
    reserve.trainer = type("Measured", (), {"eval_seconds_per_feature": 0.001})()  # measured: 1.2 s reserve
    assert budget.deadline == pytest.approx(now + 60 - 1.2)
    late = TimeBudget(now - 1)
    control = late.on_step_end(None, state, TrainerControl())
    assert control.should_training_stop and control.should_save and not control.should_evaluate
    state.global_step = 10
    control = TimeBudget(None, eval_at_end=True).on_step_end(None, state, TrainerControl())
    assert control.should_evaluate and control.should_save and not control.should_training_stop
