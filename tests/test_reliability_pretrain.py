"""Reliability of pre-training (tiny profile): a run killed with SIGKILL resumes from its last complete
checkpoint and ends exactly as an uninterrupted one; a NaN loss stops the run naming the step and batch;
a missing or corrupt --init checkpoint ends in one `error:` line, never a traceback."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pretrain
from mrc.callbacks import CHECKPOINT_DONE
from mrc.errors import MRCError

ROOT = Path(__file__).resolve().parents[1]
# 30 steps, a checkpoint (and a held-out evaluation) every 3: time to kill it between two checkpoints
FLAGS = ["--recipe", "bert", "--profile", "tiny", "--max_steps", "30", "--seed", "7"]


def command(out: Path, *flags) -> list[str]:
    return [sys.executable, str(ROOT / "src" / "pretrain.py"), *FLAGS, "--output", str(out), *flags]


ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "MRC_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def comparable(metrics: dict, out: Path) -> dict:
    """Everything but the wall time, the run's own directory left out of the tokenizer description."""
    return {k: v.replace(str(out), "<out>") if isinstance(v, str) else v for k, v in metrics.items() if k != "wall_time_s"}


@pytest.fixture(scope="module")
def tiny_vocab(data_dir, tmp_path_factory):
    """The tiny profile's vocab (built from its text), shared by runs that must match: the HF WordPiece
    trainer orders tokens differently from one process to the next (mrc.vocab.build_vocab)."""
    out = tmp_path_factory.mktemp("vocab_source")
    cfg = pretrain.resolve_config(pretrain.parse_args([*FLAGS, "--output", str(out)]))
    pretrain.resolve_tokenizer(cfg)
    return out / "vocab"


def test_kill_9_during_pretrain_resumes_to_the_same_result(tiny_vocab, tmp_path):
    reference_out, killed_out = tmp_path / "reference", tmp_path / "killed"
    for out in (reference_out, killed_out):
        shutil.copytree(tiny_vocab, out / "vocab")
    # the uninterrupted run goes alongside the one to be killed
    reference = subprocess.Popen(command(reference_out), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    ckpts = killed_out / "checkpoints"
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.Popen(command(killed_out), cwd=ROOT, env=ENV, stdout=log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while not list(ckpts.glob(f"checkpoint-*/{CHECKPOINT_DONE}")):
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.time() - t0 < 120, "no complete checkpoint within 120 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed_out / "metrics.json").exists(), "killed too late: the run had finished"
    complete = sorted(int(p.parent.name.split("-")[1]) for p in ckpts.glob(f"checkpoint-*/{CHECKPOINT_DONE}"))
    assert complete and complete[-1] < 30
    # a newer checkpoint the kill left half-written (no completion mark) must not be resumed from
    planted = ckpts / "checkpoint-29"
    shutil.rmtree(planted, ignore_errors=True)
    planted.mkdir()
    (planted / "model_state.pdparams").write_bytes(b"half a file")

    rerun = subprocess.run(command(killed_out), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "checkpoint-29: incomplete checkpoint" in rerun.stderr and not planted.exists()
    resumed = [line for line in rerun.stderr.splitlines() if "mrc.pretrain: resuming from" in line]
    assert len(resumed) == 1 and "checkpoints/checkpoint-" in resumed[0], rerun.stderr[-3000:]
    resumed_step = int(resumed[0].split("(step ")[1].split(" of")[0])
    assert resumed_step >= complete[-1] >= 3  # at least the checkpoint seen complete before the kill

    assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
    ref = json.loads((reference_out / "metrics.json").read_text(encoding="utf-8"))
    got = json.loads((killed_out / "metrics.json").read_text(encoding="utf-8"))
    assert got["global_step"] == 30 and got["heldout_masked_tokens"] > 0
    assert comparable(got, killed_out) == comparable(ref, reference_out)
    # the step count continued: the resumed run logged only the steps after its checkpoint
    state = json.loads((ckpts / "checkpoint-30" / "trainer_state.json").read_text(encoding="utf-8"))
    assert [h["step"] for h in state["log_history"] if "loss" in h] == list(range(2, 31, 2))
    assert not list(killed_out.rglob("*.tmp*"))


def test_nan_loss_stops_the_run_naming_step_and_batch(data_dir, tmp_path, monkeypatch):
    """The 3rd training forward returns NaN logits (evaluation forwards are not counted)."""
    from mrc import pretrain_model

    logits, calls = pretrain_model.pretraining_logits, []

    def poisoned(model, arch, batch):
        mlm, pair = logits(model, arch, batch)
        if model.training:
            calls.append(1)
            if len(calls) == 3:
                return mlm * float("nan"), pair
        return mlm, pair

    monkeypatch.setattr(pretrain_model, "pretraining_logits", poisoned)
    out = tmp_path / "nan"
    with pytest.raises(MRCError, match=r"loss is nan at step 3, batch 3 of epoch 1 \(8 instances, \d+ masked tokens\): "
                                       r"training diverged"):
        pretrain.main(["--recipe", "bert", "--profile", "tiny", "--output", str(out)])
    assert len(calls) == 3 and not (out / "metrics.json").exists()


def one_error_line(result, *fragments):
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr[-3000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def test_bad_init_is_one_error_line(data_dir, tmp_path):
    # a checkpoint dir with a real config and tokenizer but garbage weights
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("的一是了我不人在他有这个上们来到时大地为子中你说生国年着就那和要她出也得里后自以会家可下而过天去能对小多然于心学么之都好看起发当没成只如事把还用第样道想作种开美总从无情己面最女但现前些所同日手又行意动方期它头经长儿回位分爱老因很给名法间斯知世什两次使身者被高已亲其进此话常与活正感")),
                                    encoding="utf-8")
    (corrupt / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True}),
                                                   encoding="utf-8")
    (corrupt / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForPretraining"],
                                                     "vocab_size": 200, "hidden_size": 32, "num_hidden_layers": 1,
                                                     "num_attention_heads": 2, "intermediate_size": 64}), encoding="utf-8")
    (corrupt / "model_state.pdparams").write_bytes(b"\x00garbage" * 100)
    runs = {init: subprocess.Popen(command(tmp_path / name, "--init", init), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            for name, init in (("out_missing", "./missing_dir"), ("out_corrupt", str(corrupt)))}
    results = {}
    for init, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=120)
        results[init] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    one_error_line(results["./missing_dir"], "./missing_dir", "checkpoint directory not found")
    one_error_line(results[str(corrupt)], str(corrupt), "cannot load the bert checkpoint")
    assert not list(tmp_path.glob("out_*/metrics.json"))
