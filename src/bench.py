"""Speed and memory benchmark: one table (bash run.sh bench [--quick] [--parts ...]).

Parts (--parts, comma-separated; default all):
  train     training step time, tokens/s and GFLOP/s (vs the machine's fp32 peak) of pre-training
            (MLM at masked positions + NSP) and QA fine-tuning at the cpu profile size, seq 128/256/384,
            beside the same model and batch in HF transformers + PyTorch CPU (.venv-bench, subprocess)
  epoch     one epoch of QA fine-tuning on real questions: length bucketing + dynamic padding (this
            project) vs every window padded to max_len in random order (HF run_qa recipe), same model
  padding   padded / real tokens of the training windows with and without LengthBucketBatchSampler
  matmul    the matmul part of a QA training step alone: every matmul of the step (forward and the two of
            its backward) at the step's own shapes, GFLOP/s against the fp32 peak, beside torch.matmul
  infer     fold-ensemble prediction questions/s: dynamic graph vs exported static graph
            (mrc.export, paddle.inference with MKLDNN on / off, and oneDNN bfloat16)
  features  feature building questions/s: mrc.features.build_features (HF Rust tokenizer) vs
            paddlenlp's Python tokenizer doing the same pairs (offsets, overflow windows, stride)
  memory    peak RSS of `src/pretrain.py` (data preparation + a few steps) with the corpus x1 and x4

Timings: 2 warm-up steps, then the median of --steps. FLOPs per step are counted exactly from the
matmul shapes (forward; training = 3 x forward: backward does two matmuls per forward matmul).
Writes --output (markdown) and the same rows as JSON next to it (bench.json).
"""
import os
import sys

TORCH_WORKER_FLAG = "--torch-worker"


# ------------------------------------------------------------------------------------ PyTorch side
# Runs in .venv-bench (torch + transformers, no paddle): `python src/bench.py --torch-worker '<json>'`.
# Kept above the paddle imports so that venv never imports them.

def timed(step, steps: int) -> float:
    """2 warm-up calls, then the median seconds of `steps` calls (both sides of the benchmark)."""
    import statistics
    import time

    times = []
    for i in range(2 + steps):
        t0 = time.perf_counter()
        step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_worker(spec: dict) -> dict:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import BertConfig, BertForPreTraining, BertModel

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(0)
    s = spec["sizes"]
    config = BertConfig(vocab_size=spec["vocab_size"], hidden_size=s["hidden_size"], num_hidden_layers=s["num_hidden_layers"],
                        num_attention_heads=s["num_attention_heads"], intermediate_size=s["intermediate_size"],
                        max_position_embeddings=s["max_position_embeddings"], type_vocab_size=2, pad_token_id=0,
                        hidden_act="gelu", attn_implementation=spec.get("attn", "eager"))
    results = {"torch": torch.__version__}
    for task in spec["tasks"]:
        if task["kind"] == "infer":
            results[task["name"]] = torch_infer_seconds(config, task)
            continue
        if task["kind"] == "matmul":
            results[task["name"]] = torch_matmul_seconds(task)
            continue
        rate = float(task.get("dropout", 0.1))
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = rate
        batch = synthetic_batch(spec["vocab_size"], task["batch"], task["seq"], seed=0)
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        if task["kind"] == "pretrain":
            model = BertForPreTraining(config)

            def loss_fn():
                seq, pooled = model.bert(t["input_ids"], attention_mask=t["attention_mask"], token_type_ids=t["token_type_ids"],
                                         return_dict=False)[:2]
                hidden = seq.reshape(-1, seq.shape[-1])[t["masked_positions"]]  # masked positions only, as the paddle side
                mlm = model.cls.predictions(hidden)
                nsp = model.cls.seq_relationship(pooled)
                return F.cross_entropy(mlm, t["masked_lm_labels"]) + F.cross_entropy(nsp, t["next_sentence_labels"])
        else:
            encoder = BertModel(config)
            span, answerable = torch.nn.Linear(s["hidden_size"], 2), torch.nn.Linear(s["hidden_size"], 2)
            dropout = torch.nn.Dropout(rate)
            model = torch.nn.ModuleList([encoder, span, answerable])

            def loss_fn():
                seq, pooled = encoder(t["input_ids"], attention_mask=t["attention_mask"], token_type_ids=t["token_type_ids"],
                                      return_dict=False)[:2]
                logits = span(dropout(seq))
                pad = (1.0 - t["attention_mask"].float()) * -1e4
                start, end = logits[..., 0] + pad, logits[..., 1] + pad
                return ((F.cross_entropy(start, t["start_positions"]) + F.cross_entropy(end, t["end_positions"])) / 2
                        + F.cross_entropy(answerable(dropout(pooled)), t["answerable_label"]))
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def step():
            loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss)

        results[task["name"]] = timed(step, task["steps"])
    return results


def qa_step_matmuls(sizes: dict, batch: int, seq: int) -> list:
    """(a_shape, b_shape, transpose_a, transpose_b) of every matmul of a QA training step of a BERT encoder + span and
    answerable heads: each forward a @ b ([.., m, k] @ [.., k, n]) and its backward dA = dY @ b^T, dB = a^T @ dY.
    The FLOPs are exactly train_flops(kind='qa'); shared by both sides of the matmul part."""
    h, inter, layers, heads = (sizes[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"))
    tokens, d, bh = batch * seq, h // heads, batch * heads
    forward = layers * ([((tokens, h), (h, h))] * 4 + [((tokens, h), (h, inter)), ((tokens, inter), (inter, h)),
                                                       ((bh, seq, d), (bh, d, seq)), ((bh, seq, seq), (bh, seq, d))])
    forward += [((batch, h), (h, h)), ((tokens, h), (h, 2)), ((batch, h), (h, 2))]  # pooler, span, answerable
    calls = []
    for a, b in forward:
        y = a[:-1] + b[-1:]
        calls += [(a, b, False, False), (y, b, False, True), (a, y, True, False)]
    return calls


def matmul_flops(calls) -> float:
    total = 0.0
    for a, b, ta, tb in calls:
        m, k = (a[-1], a[-2]) if ta else (a[-2], a[-1])
        n = b[-2] if tb else b[-1]
        batch = a[0] if len(a) == 3 else 1
        total += 2.0 * batch * m * k * n
    return total


def torch_matmul_seconds(task) -> float:
    import torch

    g = torch.Generator().manual_seed(0)
    ops = [(torch.randn(*a, generator=g), torch.randn(*b, generator=g), ta, tb) for a, b, ta, tb in task["calls"]]

    def step():
        for a, b, ta, tb in ops:
            torch.matmul(a.transpose(-1, -2) if ta else a, b.transpose(-1, -2) if tb else b)

    return timed(step, task["steps"])


def torch_infer_seconds(config, task) -> float:
    """Median seconds of a forward-only pass of `task["models"]` HF BertModels + span/answerable heads over batches
    of the given [rows, width] shapes (random ids and weights: the same shapes as the paddle side's real batches)."""
    import statistics
    import time

    import numpy as np
    import torch

    config.type_vocab_size = int(task.get("type_vocab_size", 2))
    rng = np.random.RandomState(0)
    batches = [(torch.from_numpy(rng.randint(5, config.vocab_size, size=(n, w)).astype(np.int64)),
                torch.from_numpy(rng.randint(0, config.type_vocab_size, size=(n, w)).astype(np.int64))) for n, w in task["shapes"]]
    from transformers import BertModel

    models = []
    for _ in range(int(task["models"])):
        encoder = BertModel(config).eval()
        models.append((encoder, torch.nn.Linear(config.hidden_size, 2), torch.nn.Linear(config.hidden_size, 2)))

    import contextlib

    low = torch.autocast("cpu", dtype=torch.bfloat16) if task.get("bf16") else contextlib.nullcontext()

    def one_pass():
        with torch.inference_mode(), low:
            for encoder, span, answerable in models:
                for ids, types in batches:
                    seq, pooled = encoder(ids, attention_mask=(ids != 0).long(), token_type_ids=types, return_dict=False)[:2]
                    span(seq), answerable(pooled)

    for encoder, _, _ in models:  # warm-up: the two longest batches
        with torch.inference_mode():
            for ids, types in batches[-2:]:
                encoder(ids, token_type_ids=types)
    times = []
    for _ in range(int(task["passes"])):
        t0 = time.perf_counter()
        one_pass()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic_batch(vocab_size: int, batch: int, seq: int, seed: int = 0, mask_prob: float = 0.15):
    """Full-length rows ([CLS] ... [SEP] A [SEP] B), 15% masked positions (flattened), labels; numpy only."""
    import numpy as np

    rng = np.random.RandomState(seed)
    ids = rng.randint(5, vocab_size, size=(batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, seq // 2], ids[:, -1] = 2, 3, 3
    types = np.zeros((batch, seq), dtype=np.int64)
    types[:, seq // 2 + 1:] = 1
    n_mask = max(1, int(round(seq * mask_prob)))
    positions = np.concatenate([np.sort(rng.choice(np.arange(1, seq - 1), n_mask, replace=False)) + r * seq for r in range(batch)])
    return {
        "input_ids": ids, "token_type_ids": types, "attention_mask": np.ones((batch, seq), dtype=np.int64),
        "masked_positions": positions.astype(np.int64), "masked_lm_labels": ids.reshape(-1)[positions].astype(np.int64),
        "next_sentence_labels": rng.randint(0, 2, size=batch).astype(np.int64),
        "start_positions": rng.randint(0, seq, size=batch).astype(np.int64),
        "end_positions": rng.randint(0, seq, size=batch).astype(np.int64),
        "answerable_label": rng.randint(0, 2, size=batch).astype(np.int64),
    }


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == TORCH_WORKER_FLAG:
    import json as _json

    print(_json.dumps(torch_worker(_json.loads(sys.argv[2]))))
    sys.exit(0)

# ------------------------------------------------------------------------------------ Paddle side

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: E402,F401  (threads/MKL env before paddle)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, atomic_write_text, load_yaml_config  # noqa: E402

log = logging.getLogger("mrc.bench")
PARTS = ("train", "matmul", "epoch", "padding", "infer", "features", "memory")


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true", help="tiny sizes and a few steps (tests / CI, < 60 s)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)} (default all)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per measurement after 2 warm-up steps (default 5; quick 2)")
    p.add_argument("--output", default="outputs/bench/bench.md", help="markdown table (bench.json written beside it)")
    p.add_argument("--data_dir", default=None, help="data root (default: $MRC_DATA_DIR or ../shared/data)")
    p.add_argument("--batch_size", type=int, default=16, help="training batch (default 16, the cpu profile's)")
    p.add_argument("--seq_lens", default=None, help="train part: sequence lengths (default 128,256,384; quick 64)")
    p.add_argument("--exp", default="ernie_cpu", help="infer part: trained experiment outputs/<exp> (else a random-init stand-in)")
    p.add_argument("--infer_questions", type=int, default=None, help="infer part: dev questions (default 200; quick 16)")
    p.add_argument("--feature_questions", type=int, default=None, help="features part: question+passage pairs (default 1000; quick 40)")
    p.add_argument("--epoch_questions", type=int, default=None, help="epoch part: training questions (default 400; quick 16)")
    p.add_argument("--torch_python", default=str(REPO_ROOT / ".venv-bench" / "bin" / "python"),
                   help="python of the torch + transformers venv (requirements-bench.txt); missing: torch columns empty")
    return p


# ---------------------------------------------------------------------------------------- machine

def machine_info() -> dict:
    """CPU model, cores, frequency, SIMD flags and the fp32 peak they give."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: (re.search(rf"^{name}\s*:\s*(.*)$", text, re.M) or [None, ""])[1]  # noqa: E731
    flags = set(field("flags").split())
    cores = os.cpu_count() or 1
    ghz = float(field("cpu MHz") or 0) / 1000
    vendor, family = field("vendor_id"), int(field("cpu family") or 0)
    # fp32 lanes per FMA unit x FMA units per core. Zen 3/4 (AMD family 25): 2 FMA pipes of 256 bits (Zen 4
    # runs AVX-512 as two 256-bit halves), so AVX-512 does not double it; Intel server cores with AVX-512: 2 x 512.
    if "avx512f" in flags and vendor != "AuthenticAMD":
        lanes, units = 16, 2
    elif "fma" in flags:
        lanes, units = 8, 2
    else:
        lanes, units = 4, 1
    peak = cores * ghz * units * lanes * 2
    return {"cpu": field("model name"), "vendor": vendor, "family": family, "model": field("model"), "cores": cores, "ghz": round(ghz, 3),
            "fma_units": units, "simd_fp32_lanes": lanes, "peak_gflops": round(peak, 1),
            "peak_formula": f"{cores} cores x {ghz:.3f} GHz x {units} FMA units x {lanes} fp32 lanes x 2 = {peak:.0f} GFLOP/s"}


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def train_flops(sizes: dict, vocab: int, batch: int, seq: int, kind: str, n_masked: int) -> float:
    """Matmul FLOPs of one training step (forward x 3), exact from the shapes."""
    h, inter, layers = sizes["hidden_size"], sizes["intermediate_size"], sizes["num_hidden_layers"]
    tokens = batch * seq
    per_layer = 2 * tokens * h * (4 * h + 2 * inter) + 2 * 2 * batch * seq * seq * h  # QKVO + FFN; QK^T + AV
    forward = layers * per_layer + 2 * batch * h * h  # + pooler
    if kind == "pretrain":
        forward += 2 * n_masked * h * h + 2 * n_masked * h * vocab + 2 * batch * h * 2  # MLM transform + decoder, NSP
    else:
        forward += 2 * tokens * h * 2 + 2 * batch * h * 2  # span + answerable heads
    return 3.0 * forward


def timed_passes(run, passes: int) -> float:
    """Median seconds of `passes` calls (the caller has warmed up)."""
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------- helpers

class Table:
    def __init__(self):
        self.rows = []

    def add(self, part, item, this, reference=None, unit="", note=""):
        ratio = None
        if isinstance(this, (int, float)) and isinstance(reference, (int, float)) and reference:
            ratio = this / reference
        self.rows.append({"part": part, "item": item, "this": this, "reference": reference, "ratio": ratio, "unit": unit,
                          "note": note, "load": load_avg()})
        log.info("%s | %s | %s | %s | %s", part, item, _fmt(this), _fmt(reference), note)

    def markdown(self, header: str) -> str:
        lines = [header, "", "| part | measurement | this project | reference | ratio | unit | load avg (1/5/15 min) | notes |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            lines.append(f"| {r['part']} | {r['item']} | {_fmt(r['this'])} | {_fmt(r['reference'])} | "
                         f"{_fmt(r['ratio'])} | {r['unit']} | {r['load']} | {r['note']} |")
        return "\n".join(lines) + "\n"


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def tokenizers_for(ctx):
    """(paddlenlp tokenizer, fast tokenizer): the project vocab (outputs/vocab), else a small one built
    from the loaded questions (quick runs, or no vocab yet)."""
    from mrc.vocab import build_vocab, fast_tokenizer, load_tokenizer

    vocab_dir = REPO_ROOT / "outputs" / "vocab"
    if ctx.quick or not (vocab_dir / "vocab.txt").is_file():
        vocab_dir = ctx.tmp / "vocab"
        if not (vocab_dir / "vocab.txt").is_file():
            df = ctx.questions(200)
            build_vocab(df["context"].tolist() + df["question"].tolist() + df["title"].fillna("").tolist(), vocab_dir)
    tok = load_tokenizer(str(vocab_dir))
    return tok, fast_tokenizer(tok)


class Context:
    def __init__(self, args):
        self.args, self.quick = args, args.quick
        self.steps = args.steps or (2 if args.quick else 5)
        self.tmp = Path(tempfile.mkdtemp(prefix="mrc_bench_"))
        self.sizes = load_yaml_config("configs/models/offline_sizes.yaml")["tiny" if args.quick else "cpu"]
        self._train_df = None
        self._tok = None
        # the settings every timed part shares: threads per side, training sequence lengths and batch
        self.threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
        self.seq_lens = [int(s) for s in (args.seq_lens or ("64" if args.quick else "128,256,384")).split(",")]
        self.train_batch = 4 if args.quick else args.batch_size
        self.fast_paths = bool(load_yaml_config("configs/default.yaml").get("cpu_fast_paths", True))  # as training runs

    def peak_gflops(self, threads: int) -> float:
        """The fp32 peak of the cores `threads` can use, by the formula at the clock /proc/cpuinfo reports. A boosting
        CPU runs above that clock: a percentage above 100 says the cores ran faster than reported, not an error."""
        return self.machine["peak_gflops"] * min(threads, self.machine["cores"]) / self.machine["cores"]

    def train_df(self):
        if self._train_df is None:
            from mrc import data
            from mrc.sampling import select_questions

            cfg = load_yaml_config("configs/default.yaml")
            data_dir = data.resolve_data_dir(self.args.data_dir)
            names = ["checklist_demo", "robust_demo"] if self.quick else cfg["train_sources"]
            self._train_df = select_questions(data.load_sources(names, data_dir), None, 0)
        return self._train_df

    def questions(self, n, seed=0):
        df = self.train_df()
        if len(df) <= n:
            return df
        return df.loc[sorted(random.Random(seed).sample(list(df.index), n))].reset_index(drop=True)

    def tokenizers(self):
        if self._tok is None:
            self._tok = tokenizers_for(self)
        return self._tok


# ------------------------------------------------------------------------------------------ train

# the per-row arrays of a synthetic batch that a QA step takes (the rest are pre-training's)
QA_BATCH_KEYS = ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions", "answerable_label")


def paddle_train_step(kind, sizes, vocab, batch_np, dropout=0.1, fast_paths=True, data_parallel=False):
    import paddle
    import paddle.nn.functional as F

    from mrc.model import SpanAnswerableModel
    from mrc.pretrain_model import new_pretraining_model, pretraining_logits

    paddle.seed(0)
    b = {k: paddle.to_tensor(v) for k, v in batch_np.items()}
    if kind == "pretrain":
        model = new_pretraining_model("bert", sizes, vocab, 0)

        def loss_fn():
            mlm, nsp = pretraining_logits(model, "bert", b)
            return F.cross_entropy(mlm, b["masked_lm_labels"].reshape([-1, 1])) + F.cross_entropy(nsp, b["next_sentence_labels"].reshape([-1, 1]))
    else:
        from paddlenlp.transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=vocab, pad_token_id=0, type_vocab_size=2, hidden_dropout_prob=dropout,
                            attention_probs_dropout_prob=dropout, **sizes)
        model = SpanAnswerableModel(BertModel(config), dropout=dropout)
        inputs = {k: b[k] for k in QA_BATCH_KEYS if k != "attention_mask"}
        inputs["attention_mask"] = b["attention_mask"].astype("float32")
        net = model

        def loss_fn():
            return net(**inputs)[0]
    if fast_paths:
        from mrc.fast_encoder import speed_up_for_cpu

        speed_up_for_cpu(model)
    if data_parallel:  # gradients all-reduced over the ranks, as paddlenlp's Trainer does under the launcher
        net = paddle.DataParallel(model)
    model.train()
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)

    def step():
        loss = loss_fn()
        loss.backward()
        opt.step()
        opt.clear_grad()
        return float(loss)

    return step


def run_torch(ctx, spec: dict) -> dict | None:
    python = Path(ctx.args.torch_python)
    if not python.is_file():
        log.warning("no torch venv at %s (python3 -m venv .venv-bench && .venv-bench/bin/pip install -r requirements-bench.txt): "
                    "torch columns left empty", python)
        return None
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.run([str(python), os.path.abspath(__file__), TORCH_WORKER_FLAG, json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        log.warning("torch worker failed: %s", (proc.stderr.strip().splitlines() or ["?"])[-1])
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


DP_WORKER_FLAG = "--dp-worker"


def dp_worker(spec: dict) -> None:
    """One rank of the data-parallel QA step (started by run_data_parallel): its share of the batch's rows; rank 0
    writes the median step seconds to spec['output']."""
    from mrc.distributed import ensure_process_group, world_info

    ensure_process_group()
    info = world_info()
    batch = synthetic_batch(spec["vocab"], spec["batch"], spec["seq"])
    rows = {k: batch[k][info.rank::info.world_size] for k in QA_BATCH_KEYS}
    step = paddle_train_step("qa", spec["sizes"], spec["vocab"], rows, spec["dropout"], spec["fast_paths"], data_parallel=True)
    seconds = timed(step, spec["steps"])
    if info.rank == 0:
        atomic_write_json(spec["output"], {"seconds": seconds, "world_size": info.world_size})


def run_data_parallel(ctx, nproc: int, seq: int, vocab: int) -> float | None:
    """Median seconds of a QA step of the whole batch split over `nproc` one-thread processes (src/launch.py --nproc:
    how `bash run.sh all` trains)."""
    from launch import build_command, parse

    out = ctx.tmp / f"dp_{nproc}_{seq}.json"
    spec = {"vocab": vocab, "batch": ctx.train_batch, "seq": seq, "sizes": ctx.sizes, "dropout": 0.1, "steps": ctx.steps,
            "fast_paths": ctx.fast_paths, "output": str(out)}
    log_dir = REPO_ROOT / "outputs" / "bench" / "dp_logs"
    args, rest = parse([os.path.abspath(__file__), "--nproc", str(nproc), "--log_dir", str(log_dir),
                        DP_WORKER_FLAG, json.dumps(spec)])
    cmd, env = build_command(args, rest)
    env = dict(os.environ, **env, PYTHONPATH=str(REPO_ROOT / "src"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        log.warning("data-parallel step (%d processes, seq %d) failed: see %s", nproc, seq, log_dir)
        return None
    return json.loads(out.read_text())["seconds"]


def part_train(ctx, table):
    import paddle

    machine = ctx.machine
    _, fast = ctx.tokenizers()
    vocab = fast.get_vocab_size()
    seqs, batch = ctx.seq_lens, ctx.train_batch
    tasks = [{"name": f"{kind}@{seq}", "kind": kind, "seq": seq, "batch": batch, "steps": ctx.steps, "dropout": 0.1}
             for kind in ("pretrain", "qa") for seq in seqs]
    # one QA row without dropout on both sides (train --dropout 0, an option for models trained from random init)
    mid = seqs[len(seqs) // 2]
    tasks.append({"name": f"qa-nodropout@{mid}", "kind": "qa", "seq": mid, "batch": batch, "steps": ctx.steps, "dropout": 0.0})
    # and one with paddle's own encoder forward (cpu_fast_paths: false): what mrc.fast_encoder gains
    tasks.append({"name": f"qa-paddleforward@{mid}", "kind": "qa", "seq": mid, "batch": batch, "steps": ctx.steps, "dropout": 0.1,
                  "fast_paths": False})
    # paddle and torch alternate per configuration, so both sides of a ratio see about the same machine load
    paddle_times, torch_times, torch_version = {}, {}, "not run"
    threads = ctx.threads
    for task in tasks:
        step = paddle_train_step(task["kind"], ctx.sizes, vocab, synthetic_batch(vocab, batch, task["seq"]), task["dropout"],
                                 task.get("fast_paths", ctx.fast_paths))
        paddle_times[task["name"]] = (timed(step, ctx.steps), load_avg())
        del step
        result = run_torch(ctx, {"threads": threads, "sizes": ctx.sizes, "vocab_size": vocab, "tasks": [task]}) or {}
        torch_version = result.get("torch", torch_version)
        torch_times[task["name"]] = result.get(task["name"])
    # the same batch of 16 split over one-thread processes, as `bash run.sh all` trains (beside torch's 2 threads)
    nproc = min(threads, ctx.machine["cores"])
    dp_times = {seq: run_data_parallel(ctx, nproc, seq, vocab) for seq in seqs} if nproc > 1 else {}
    peak = ctx.peak_gflops(threads)
    for task in tasks:
        name, seq = task["name"], task["seq"]
        n_masked = batch * max(1, int(round(seq * 0.15)))
        flops = train_flops(ctx.sizes, vocab, batch, seq, task["kind"], n_masked)
        pt, load = paddle_times[name]
        tt = torch_times.get(name)
        label = "pre-training MLM+NSP" if task["kind"] == "pretrain" else "QA fine-tuning"
        if task["dropout"] == 0:
            label += " without dropout"
        if not task.get("fast_paths", ctx.fast_paths):
            label += ", paddle's own encoder forward"
        tokens = batch * seq
        table.add("train", f"{label} step, seq {seq} x batch {batch}", pt, tt, "s/step",
                  f"paddle {paddle.__version__} vs torch {torch_version} (transformers Bert, same sizes, {threads} threads each); load {load}")
        table.add("train", f"{label} tokens/s, seq {seq}", tokens / pt, tokens / tt if tt else None, "tokens/s", "")
        table.add("train", f"{label} GFLOP/s, seq {seq}", flops / pt / 1e9, flops / tt / 1e9 if tt else None, "GFLOP/s",
                  f"{flops / 1e9:.1f} GFLOP/step (exact matmuls x3); paddle {100 * flops / pt / 1e9 / peak:.1f}% of the "
                  f"{peak:.0f} GFLOP/s peak of {min(threads, machine['cores'])} core(s)")
        if task["kind"] == "qa" and task["dropout"] and "fast_paths" not in task and dp_times.get(seq):
            dp = dp_times[seq]
            table.add("train", f"QA fine-tuning step, seq {seq} x batch {batch}, {nproc} processes x 1 thread x {batch // nproc} rows",
                      dp, tt, "s/step", f"data parallel (src/launch.py --nproc {nproc}, gloo all-reduce), as bash run.sh all "
                      f"trains; {100 * flops / dp / 1e9 / peak:.1f}% of peak; reference: torch, {threads} threads, batch {batch}")


# ----------------------------------------------------------------------------------------- matmul

def part_matmul(ctx, table):
    """The matmul-heavy part of a QA step on its own: paddle.matmul over the step's matmul calls (qa_step_matmuls)."""
    import paddle

    machine, threads = ctx.machine, ctx.threads
    peak = ctx.peak_gflops(threads)
    seqs, batch = ctx.seq_lens, ctx.train_batch
    for seq in seqs:
        calls = qa_step_matmuls(ctx.sizes, batch, seq)
        paddle.seed(0)
        ops = [(paddle.randn(list(a)), paddle.randn(list(b)), ta, tb) for a, b, ta, tb in calls]

        def step():
            for a, b, ta, tb in ops:
                paddle.matmul(a, b, transpose_x=ta, transpose_y=tb)

        pt = timed(step, ctx.steps)
        result = run_torch(ctx, {"threads": threads, "sizes": ctx.sizes, "vocab_size": 0,
                                 "tasks": [{"name": "matmul", "kind": "matmul", "calls": calls, "steps": ctx.steps}]}) or {}
        tt = result.get("matmul")
        flops = matmul_flops(calls)
        table.add("matmul", f"matmuls of a QA step alone, seq {seq} x batch {batch}, GFLOP/s", flops / pt / 1e9,
                  flops / tt / 1e9 if tt else None, "GFLOP/s",
                  f"{len(calls)} matmuls (forward + 2 backward each), {flops / 1e9:.1f} GFLOP in {pt:.3f} s; paddle "
                  f"{100 * flops / pt / 1e9 / peak:.1f}% of the {peak:.0f} GFLOP/s peak of {min(threads, machine['cores'])} core(s) "
                  f"at the reported clock (above 100%: the cores boost above it); "
                  f"reference torch.matmul {result.get('torch', 'not run')}")


# ------------------------------------------------------------------------------------------ epoch

def part_epoch(ctx, table):
    """One epoch of QA fine-tuning: project batching (bucketed, dynamic padding) vs run_qa (max_len padding)."""
    import paddle
    from paddlenlp.transformers import BertConfig, BertModel

    from mrc.features import build_features
    from mrc.finetune import FeatureDataset, LengthBucketBatchSampler, collate
    from mrc.fast_encoder import speed_up_for_cpu
    from mrc.model import SpanAnswerableModel

    n_q = ctx.args.epoch_questions or (16 if ctx.quick else 400)
    max_len, stride = (128, 32) if ctx.quick else (256, 64)
    df = ctx.questions(n_q, seed=1)
    _, fast = ctx.tokenizers()
    # the two recipes train side by side, one batch each in turn, so both see the same machine load;
    # the feature building time (the same for both) is counted in each
    t0 = time.perf_counter()
    feats = build_features(df, fast, max_len, stride, use_title=True)
    build_s = time.perf_counter() - t0
    dataset = FeatureDataset(feats)
    order = list(range(len(feats)))
    random.Random(0).shuffle(order)
    batch_lists = {"project": LengthBucketBatchSampler(feats.lengths(), ctx.args.batch_size, seed=0).batches(),
                   "run_qa": [order[i: i + ctx.args.batch_size] for i in range(0, len(order), ctx.args.batch_size)]}
    runs = {}
    for recipe in batch_lists:
        paddle.seed(0)
        model = SpanAnswerableModel(BertModel(BertConfig(vocab_size=fast.get_vocab_size(), pad_token_id=0, type_vocab_size=2, **ctx.sizes)))
        if recipe == "project" and ctx.fast_paths:  # the project trains with them; run_qa runs the stock model
            speed_up_for_cpu(model)
        model.train()
        opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)
        runs[recipe] = {"model": model, "opt": opt, "seconds": build_s, "real": 0, "padded": 0}
    for step in range(max(len(b) for b in batch_lists.values())):
        for recipe, batches in batch_lists.items():
            if step >= len(batches):
                continue
            run = runs[recipe]
            t0 = time.perf_counter()
            b = collate([dataset[i] for i in batches[step]])
            if recipe == "run_qa":  # pad every window to max_len (HF run_qa: padding="max_length")
                for k in ("input_ids", "token_type_ids", "attention_mask"):
                    b[k] = np.pad(b[k], ((0, 0), (0, max_len - b[k].shape[1])))
            loss = run["model"](**{k: paddle.to_tensor(v) for k, v in b.items()})[0]
            loss.backward()
            run["opt"].step()
            run["opt"].clear_grad()
            run["seconds"] += time.perf_counter() - t0
            run["real"] += int(b["attention_mask"].sum())
            run["padded"] += b["input_ids"].size
    results = {r: (runs[r]["seconds"], len(feats), len(batch_lists[r]), runs[r]["padded"] / runs[r]["real"], load_avg()) for r in runs}
    p, r = results["project"], results["run_qa"]
    table.add("epoch", f"QA epoch, {len(df)} questions ({p[1]} windows, {p[2]} steps), max_len {max_len}", p[0], r[0], "s/epoch",
              f"this: length buckets + dynamic padding (padded/real {p[3]:.2f}){' + CPU fast paths' if ctx.fast_paths else ''}; "
              f"reference: HF run_qa padding to max_len (padded/real {r[3]:.2f}), paddle's stock model; same weights and seed; feature building ({build_s:.1f} s) counted in both; batches of the two interleaved")


# ---------------------------------------------------------------------------------------- padding

def part_padding(ctx, table):
    from mrc.features import build_features
    from mrc.finetune import LengthBucketBatchSampler

    n_q = 200 if ctx.quick else 1600
    max_len, stride = 256, 64
    df = ctx.questions(n_q, seed=2)
    _, fast = ctx.tokenizers()
    lengths = build_features(df, fast, max_len, stride, use_title=True).lengths()
    bs = ctx.args.batch_size
    order = list(range(len(lengths)))
    random.Random(0).shuffle(order)
    plain = [order[i: i + bs] for i in range(0, len(order), bs)]
    bucketed = LengthBucketBatchSampler(lengths, bs, seed=0).batches()
    real = int(lengths.sum())

    def padded(batches):
        return sum(len(b) * int(lengths[b].max()) for b in batches)

    note = f"{len(df)} questions, {len(lengths)} windows (max_len {max_len}, stride {stride}), batch {bs}"
    table.add("padding", "padded/real tokens, max_len padding (HF run_qa)", len(lengths) * max_len / real, None, "ratio", note)
    table.add("padding", "padded/real tokens, dynamic padding, random batches", padded(plain) / real, None, "ratio", note)
    table.add("padding", "padded/real tokens, dynamic padding + length buckets", padded(bucketed) / real, None, "ratio",
              f"{note}; mrc.finetune.LengthBucketBatchSampler (chunks of 50 batches)")


# ------------------------------------------------------------------------------------------ infer

def stand_in_experiment(ctx):
    """A trained-experiment look-alike (2 random-init folds) when outputs/<exp> is absent or --quick."""
    import paddle
    from paddlenlp.transformers import ErnieConfig, ErnieModel

    from mrc.model import SpanAnswerableModel

    tok, fast = ctx.tokenizers()
    exp = ctx.tmp / "exp"
    for k in range(2):
        model_dir = exp / f"fold{k}" / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        encoder = ErnieModel(ErnieConfig(vocab_size=fast.get_vocab_size(), pad_token_id=0, type_vocab_size=2, **ctx.sizes))
        encoder.config.save_pretrained(str(model_dir))
        paddle.save(SpanAnswerableModel(encoder).state_dict(), str(model_dir / "model_state.pdparams"))
    tok.save_pretrained(str(exp / "tokenizer"))
    info = {"folds": 2, "backbone": {"arch": "ernie"}, "features": {"max_len": 128 if ctx.quick else 256, "stride": 32 if ctx.quick else 64, "use_title": True}}
    atomic_write_json(exp / "train_info.json", info)
    return exp


def part_infer(ctx, table):
    import paddle

    from mrc import data
    from mrc.export import InferenceRunner, export_fold_model
    from mrc.features import build_features
    from mrc.finetune import predict_logits
    from mrc.folds import trained_folds
    from mrc.io_utils import read_json
    from mrc.vocab import fast_tokenizer, load_tokenizer
    from mrc.model import load_fold_model

    exp = REPO_ROOT / "outputs" / ctx.args.exp
    if ctx.quick or not (exp / "train_info.json").is_file():
        if not ctx.quick:
            log.warning("%s: no trained experiment; timing random-init stand-in folds of the same size", exp)
        exp = stand_in_experiment(ctx)
    info = read_json(exp / "train_info.json")
    n_q = ctx.args.infer_questions or (16 if ctx.quick else 200)
    dev = data.load_sources(["checklist_dev"], data.resolve_data_dir(ctx.args.data_dir))
    dev = dev.loc[sorted(random.Random(3).sample(list(dev.index), min(n_q, len(dev))))].reset_index(drop=True)
    fast = fast_tokenizer(load_tokenizer(str(exp / "tokenizer")))
    f = info["features"]
    feats = build_features(dev, fast, f["max_len"], f["stride"], f["use_title"])
    arch, fold_ids = info["backbone"]["arch"], trained_folds(info)  # --train_folds: only those folds have models
    folds = len(fold_ids)
    models = [load_fold_model(exp / f"fold{k}", arch) for k in fold_ids]
    batch_size = 32

    # a "step" here is a whole pass over the questions: 2 warm-up batches per model, then the median of
    # `passes` timed passes (each pass is hundreds of batches)
    passes = max(1, ctx.steps // 3)
    order = np.argsort(feats.lengths(), kind="stable")
    warm = feats.subset(order[-2 * batch_size:])  # the longest windows: every kernel shape seen once

    def dynamic():
        return [predict_logits(m, feats, batch_size)[0] for m in models]

    for m in models:
        predict_logits(m, warm, batch_size)
    t_dyn = timed_passes(dynamic, passes)
    dyn_logits = dynamic()
    prefixes = [export_fold_model(exp / f"fold{k}", arch, ctx.tmp / "export" / f"fold{k}", model=m) for k, m in zip(fold_ids, models)]
    batches = []
    for s in range(0, len(order), batch_size):
        idx = order[s: s + batch_size]
        width = int(feats.lengths()[idx].max())
        ids = np.zeros((len(idx), width), np.int64)
        types = np.zeros((len(idx), width), np.int64)
        for r, i in enumerate(idx):
            ids[r, : len(feats.input_ids[i])] = feats.input_ids[i]
            types[r, : len(feats.token_type_ids[i])] = feats.token_type_ids[i]
        batches.append((idx, ids, types))
    enc_config = models[0].encoder.config
    torch_sizes = {k: int(getattr(enc_config, k)) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                           "intermediate_size", "max_position_embeddings")}
    result = run_torch(ctx, {"threads": ctx.threads, "sizes": torch_sizes,
                             "vocab_size": int(enc_config.vocab_size),
                             "tasks": [{"name": name, "kind": "infer", "models": folds, "passes": passes, "bf16": name == "infer_bf16",
                                        "type_vocab_size": int(enc_config.type_vocab_size),
                                        "shapes": [[int(ids.shape[0]), int(ids.shape[1])] for _, ids, _ in batches]}
                                       for name in ("infer", "infer_bf16")]}) or {}
    t_torch = result.get("infer")
    torch_note = (f"reference = PyTorch {result.get('torch')} eager (HF BertModel + heads, same sizes and batches, "
                  f"inference_mode) {len(dev) / t_torch:.1f} q/s" if t_torch else "no PyTorch reference (.venv-bench missing)")
    table.add("infer", f"fold ensemble ({folds} folds) dynamic graph", len(dev) / t_dyn, len(dev) / t_torch if t_torch else None, "questions/s",
              f"{len(dev)} dev questions, {len(feats)} windows, batch {batch_size}, length-sorted; forward only; "
              f"median of {passes} pass(es) after 2 warm-up batches; {'trained' if exp.parent.name == 'outputs' else 'stand-in'} folds {exp.name}; {torch_note}")
    for mkldnn, bf16 in ((False, False), (True, False), (True, True)):
        runners = [InferenceRunner(p, mkldnn=mkldnn, threads=ctx.threads, bf16=bf16)
                   for p in prefixes]
        first = {}

        def static():
            for k, runner in enumerate(runners):
                for idx, ids, types in batches:
                    out = runner(ids, types)
                    if k == 0 and idx[0] == order[0]:
                        first["start"] = out[0]

        for runner in runners:
            for _, ids, types in batches[-2:]:
                runner(ids, types)
        t_static = timed_passes(static, passes)
        idx0 = batches[0][0]
        diff = max(float(np.abs(first["start"][r, :n] - dyn_logits[0]["start_logits"][i, :n]).max())
                   for r, i in enumerate(idx0) for n in [len(feats.input_ids[i])])  # real tokens (padding differs by design)
        reference = ("PyTorch eager", t_torch) if t_torch else ("the paddle dynamic graph", t_dyn)
        if bf16 and result.get("infer_bf16"):  # like for like: torch's own bf16 (autocast) inference
            reference = ("PyTorch eager with torch.autocast(cpu, bfloat16)", result["infer_bf16"])
        table.add("infer", f"fold ensemble static graph (paddle.inference, MKLDNN {'on' if mkldnn else 'off'}"
                           f"{', bfloat16' if bf16 else ''})",
                  len(dev) / t_static, len(dev) / reference[1], "questions/s",
                  f"reference = {reference[0]}; dynamic graph {len(dev) / t_dyn:.1f} q/s; max |start logit diff| vs dynamic "
                  f"{diff:.2g}; paddle {paddle.__version__}")


# --------------------------------------------------------------------------------------- features

def part_features(ctx, table):
    from mrc.features import build_features

    n_q = ctx.args.feature_questions or (40 if ctx.quick else 1000)
    max_len, stride = 256, 64
    df = ctx.questions(n_q, seed=4)
    tok, fast = ctx.tokenizers()
    t0 = time.perf_counter()
    feats = build_features(df, fast, max_len, stride, use_title=False)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    enc = tok(df["question"].tolist(), df["context"].tolist(), max_length=max_len, stride=stride, truncation="only_second",
              return_overflowing_tokens=True, return_offsets_mapping=True, return_token_type_ids=True)
    t_slow = time.perf_counter() - t0
    n_slow = len(enc["input_ids"])
    table.add("features", "questions/s, build_features (HF Rust tokenizer)", len(df) / t_fast, len(df) / t_slow, "questions/s",
              f"{len(df)} real question+passage pairs, max_len {max_len}, stride {stride}: {len(feats)} windows; reference "
              f"paddlenlp {type(tok).__name__} (offsets + overflow, its own stride semantics): {n_slow} windows")


# ----------------------------------------------------------------------------------------- memory

def part_memory(ctx, table):
    """Peak RSS of src/pretrain.py (data prep + a few steps) on the corpus x1 and x4, in subprocesses."""
    from mrc.data import corpus_path, resolve_data_dir

    src_data = resolve_data_dir(ctx.args.data_dir)
    corpus = corpus_path(src_data)
    lines = None
    if ctx.quick:
        with open(corpus, encoding="utf-8") as fh:
            lines = [next(fh) for _ in range(30)]
    results = {}
    for factor in (1, 4):
        data_dir = ctx.tmp / f"data_x{factor}"
        (data_dir / "corpus").mkdir(parents=True, exist_ok=True)
        os.symlink(src_data / "mrc", data_dir / "mrc")
        with open(data_dir / "corpus" / corpus.name, "w", encoding="utf-8") as out:
            for _ in range(factor):
                if lines is not None:
                    out.writelines(lines)
                else:
                    with open(corpus, encoding="utf-8") as fh:
                        shutil.copyfileobj(fh, out)
        size_mb = (data_dir / "corpus" / corpus.name).stat().st_size / 2 ** 20
        cmd = ["/usr/bin/time", "-v", sys.executable, str(REPO_ROOT / "src" / "pretrain.py"), "--recipe", "bert",
               "--profile", "tiny" if ctx.quick else "cpu", "--max_steps", "3", "--corpus_lines", "100000000",
               "--max_passages", "50" if ctx.quick else "500", "--data_dir", str(data_dir), "--output", str(ctx.tmp / f"pretrain_x{factor}")]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=dict(os.environ, MRC_OFFLINE="1"))
        wall = time.perf_counter() - t0
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
        if proc.returncode != 0 or not m:
            raise MRCError(f"pretrain x{factor} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        results[factor] = (int(m.group(1)) / 1024, size_mb, wall)
        table.add("memory", f"peak RSS pretrain.py, corpus x{factor} ({size_mb:.1f} MB)", results[factor][0],
                  results[1][0] if factor != 1 else None, "MB",
                  f"data prep + 3 steps + final eval, profile {'tiny' if ctx.quick else 'cpu'}, {wall:.0f} s wall; /usr/bin/time -v")


# ------------------------------------------------------------------------------------------- main

def main(argv=None):
    args = build_parser().parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise MRCError(f"--parts: unknown part {unknown[0]} (known: {', '.join(PARTS)})")
    if args.steps is not None and args.steps < 1:
        raise MRCError(f"--steps must be at least 1, got {args.steps}")
    ctx = Context(args)
    ctx.machine = machine_info()
    table = Table()
    start_load = load_avg()
    try:
        for part in PARTS:
            if part in parts:
                log.info("bench part %s (load %s)", part, load_avg())
                globals()[f"part_{part}"](ctx, table)
    finally:
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    m = ctx.machine
    header = (f"# bench ({'quick' if args.quick else 'full'})\n\n"
              f"Machine: {m['cpu']} (family {m['family']} model {m['model']}), {m['cores']} cores; fp32 peak {m['peak_formula']}. "
              f"Threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, MKL_DEBUG_CPU_TYPE={os.environ.get('MKL_DEBUG_CPU_TYPE')}. "
              f"Model: {'tiny' if args.quick else 'cpu'} size {ctx.sizes}. Timings: 2 warm-up steps, median of {ctx.steps}. "
              f"Load average at start {start_load}, at end {load_avg()} (the machine may be shared: compare ratios, "
              f"which come from one run). Ratio = this project / reference.")
    out = Path(args.output)
    out = out if out.is_absolute() else REPO_ROOT / out
    atomic_write_text(out, table.markdown(header))
    atomic_write_json(out.with_name("bench.json"), {"machine": m, "quick": args.quick, "steps": ctx.steps, "sizes": ctx.sizes,
                                                    "rows": table.rows})
    print(table.markdown(header))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == DP_WORKER_FLAG:
        runtime.run_main(lambda: dp_worker(json.loads(sys.argv[2])))
    else:
        runtime.run_main(main)
