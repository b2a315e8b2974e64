"""bench.py smoke test: the quick padding + features parts on real questions give the expected table."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(args, data_dir, tmp_path, threads=1):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), MRC_DATA_DIR=str(data_dir), MRC_OFFLINE="1",
               OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, str(ROOT / "src" / "bench.py"), *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_bench_quick_padding_and_features(data_dir, tmp_path):
    out = tmp_path / "bench" / "bench.md"
    proc = run_bench(["--quick", "--parts", "padding,features", "--output", str(out)], data_dir, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out.parent / "bench.json").read_text(encoding="utf-8"))["rows"]
    padding = {r["item"]: r["this"] for r in rows if r["part"] == "padding"}
    max_len = padding["padded/real tokens, max_len padding (HF run_qa)"]
    dynamic = padding["padded/real tokens, dynamic padding, random batches"]
    bucketed = padding["padded/real tokens, dynamic padding + length buckets"]
    assert 1.0 <= bucketed < dynamic <= max_len  # buckets waste less than random batches, which never beat max_len
    features = [r for r in rows if r["part"] == "features"]
    assert len(features) == 1 and features[0]["this"] > 0 and features[0]["reference"] > 0
    assert {r["part"] for r in rows} == {"padding", "features"}
    table = out.read_text(encoding="utf-8")
    assert "| padding | padded/real tokens, dynamic padding + length buckets |" in table
    assert "fp32 peak" in table


def test_bench_quick_matmul_part(tmp_path):
    """The matmul part times the QA step's own matmuls: its FLOPs are the step's (train_flops), the row says % of peak."""
    out = tmp_path / "bench" / "bench.md"
    proc = run_bench(["--quick", "--parts", "matmul", "--output", str(out), "--torch_python", str(tmp_path / "no-python")],
                     ROOT / "data", tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads((out.parent / "bench.json").read_text(encoding="utf-8"))["rows"]
    assert [r["part"] for r in rows] == ["matmul"]
    row = rows[0]
    assert row["item"] == "matmuls of a QA step alone, seq 64 x batch 4, GFLOP/s" and row["this"] > 0
    assert row["reference"] is None and "% of the" in row["note"]  # no torch venv given: reference left empty


def test_step_matmuls_count_the_training_flops():
    sys.path.insert(0, str(ROOT / "src"))
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_module", ROOT / "src" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sizes = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4}
    calls = bench.qa_step_matmuls(sizes, 16, 256)
    assert len(calls) == 3 * (4 * 8 + 3)  # 8 matmuls per layer + pooler + 2 heads, each forward + 2 backward
    assert bench.matmul_flops(calls) == bench.train_flops(sizes, 1000, 16, 256, "qa", 0)
    # the backward of attention scores [B*h, L, d] @ [B*h, d, L]: dA = dY @ B^T and dB = A^T @ dY keep the batch dim
    assert ((64, 256, 256), (64, 32, 256), False, True) in calls and ((64, 256, 32), (64, 256, 256), True, False) in calls


def test_bench_rejects_unknown_part(tmp_path):
    proc = run_bench(["--quick", "--parts", "padding,nope", "--output", str(tmp_path / "b.md")], ROOT / "data", tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith("error: --parts: unknown part nope")
    assert not (tmp_path / "b.md").exists()


def test_export_fold_model_matches_dynamic_graph(tmp_path):
    """mrc.export: a fold model dir -> inference model whose logits equal the dynamic model's (MKLDNN on and off)."""
    import numpy as np
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieModel

    from mrc.export import InferenceRunner, export_fold_model
    from mrc.model import SpanAnswerableModel

    paddle.seed(0)
    model_dir = tmp_path / "fold0" / "model"
    model_dir.mkdir(parents=True)
    encoder = ErnieModel(ErnieConfig(vocab_size=300, pad_token_id=0, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64))
    encoder.config.save_pretrained(str(model_dir))
    model = SpanAnswerableModel(encoder)
    paddle.save(model.state_dict(), str(model_dir / "model_state.pdparams"))
    prefix = export_fold_model(tmp_path / "fold0", "ernie", tmp_path / "export")  # loads the dir like predict.py
    ids = np.random.RandomState(0).randint(5, 300, (3, 17)).astype("int64")
    ids[1, 12:] = 0  # a padded row
    types = np.zeros_like(ids)
    types[:, 8:] = 1
    model.eval()
    with paddle.no_grad():
        expected = [t.numpy() for t in model(paddle.to_tensor(ids), token_type_ids=paddle.to_tensor(types))]
    for mkldnn in (False, True):
        got = InferenceRunner(prefix, mkldnn=mkldnn, threads=1)(ids, types)
        assert [g.shape for g in got] == [(3, 17), (3, 17), (3, 2)]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


def test_bench_quick_train_part_times_the_data_parallel_step(data_dir, tmp_path):
    """The train part adds the QA step as `bash run.sh all` trains it (2 one-thread processes, src/launch.py) and the
    step with paddle's own encoder forward (what mrc.fast_encoder gains), beside the plain rows."""
    out = tmp_path / "bench" / "bench.md"
    proc = run_bench(["--quick", "--parts", "train", "--output", str(out), "--torch_python", str(tmp_path / "no-python")],
                     data_dir, tmp_path, threads=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = {r["item"]: r["this"] for r in json.loads((out.parent / "bench.json").read_text(encoding="utf-8"))["rows"]
             if r["unit"] == "s/step"}
    assert steps["QA fine-tuning step, seq 64 x batch 4, 2 processes x 1 thread x 2 rows"] > 0
    assert steps["QA fine-tuning, paddle's own encoder forward step, seq 64 x batch 4"] > 0
    assert steps["QA fine-tuning step, seq 64 x batch 4"] > 0 and steps["pre-training MLM+NSP step, seq 64 x batch 4"] > 0
