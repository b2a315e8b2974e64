"""Data-parallel training through src/launch.py -> paddle.distributed.launch (2 CPU processes, gloo).

The end-to-end test trains a tiny BERT for 2 steps with paddlenlp's Trainer in 2 processes, each on its
own share of every global batch, and checks it against one process trained on the whole global batch.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import launch
from mrc import distributed

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"
STEPS, PER_RANK_BATCH, RANKS = 2, 4, 2


def command(argv, **kwargs):
    args, stage_args = launch.parse(argv)
    return launch.build_command(args, stage_args, python="PY", **kwargs)


def test_gpu_command_uses_devices_and_passes_stage_flags_through():
    cmd, env = command(["train", "--model", "ernie", "--gpus", "0,1,2,3", "--folds", "5", "--log_dir", "L"], cpu_count=8)
    assert cmd == ["PY", "-m", "paddle.distributed.launch", "--log_dir", "L", "--devices", "0,1,2,3",
                   str(ROOT / "src" / "train.py"), "--model", "ernie", "--folds", "5"]
    assert env == {"OMP_NUM_THREADS": "2"}  # 8 cores shared by 4 processes


def test_cpu_command_runs_n_single_thread_processes():
    cmd, env = command(["pretrain", "--nproc=2", "--recipe", "ernie"], now=0)
    assert cmd[3] == "--log_dir" and Path(cmd[4]).parent == ROOT / "outputs" / "pretrain" / "launch_logs"
    assert cmd[5:] == ["--nproc_per_node", "2", str(ROOT / "src" / "pretrain.py"), "--recipe", "ernie"]
    assert "--devices" not in cmd and env == {"OMP_NUM_THREADS": "1"}


def test_multi_machine_flags_map_to_paddle_launcher_flags():
    cmd, _ = command(["train", "--gpus", "0,1", "--nnodes", "2", "--master", "10.0.0.1:8090", "--node_rank", "1", "--log_dir", "L"])
    assert cmd[5:13] == ["--devices", "0,1", "--nnodes", "2", "--master", "10.0.0.1:8090", "--rank", "1"]
    cmd, _ = command(["train", "--gpus", "0", "--ips", "10.0.0.1,10.0.0.2", "--log_dir", "L"])
    assert cmd[7:9] == ["--ips", "10.0.0.1,10.0.0.2"]


@pytest.mark.parametrize("argv", [["train", "--gpus", "a,b"], ["train", "--nproc", "0"], ["train", "--model", "x"],
                                  ["evaluate", "--nproc", "2"], ["train", "--gpus", "0", "--nproc", "2"],
                                  ["train", "--nproc", "2", "--master", "nohostport"]])
def test_bad_launcher_flags_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        launch.parse(argv)
    assert exc.value.code == 2


def test_run_sh_sends_pretrain_and_train_with_launcher_flags_to_launch_py():
    flags_line = next(line for line in (ROOT / "run.sh").read_text().splitlines() if "--nproc|--nproc=*" in line)
    assert {f.strip() for f in flags_line.split(")")[0].split("case \"$arg\" in")[1].replace("=*", "").split("|")} \
        == {f.strip() for f in launch.LAUNCH_FLAGS}
    env = {**os.environ, "MRC_VENV": str(Path(sys.executable).parents[1])}
    routed = subprocess.run(["bash", str(ROOT / "run.sh"), "train", "--nproc", "0"], env=env, capture_output=True, text=True)
    assert routed.returncode == 2 and "src/launch.py: error: argument --nproc" in routed.stderr
    direct = subprocess.run(["bash", str(ROOT / "run.sh"), "pretrain", "--no_such_flag"], env=env, capture_output=True, text=True)
    assert direct.returncode == 2 and "launch.py" not in direct.stderr and "--no_such_flag" in direct.stderr


def test_world_info_from_launcher_env(monkeypatch):
    for key in ("PADDLE_TRAINER_ID", "PADDLE_GLOBAL_RANK", "PADDLE_TRAINERS_NUM", "PADDLE_GLOBAL_SIZE",
                "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert distributed.world_info() == (0, 1, 0) and distributed.is_main_process()
    distributed.barrier()  # single process: returns at once
    monkeypatch.setenv("PADDLE_TRAINER_ID", "3")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    monkeypatch.setenv("PADDLE_RANK_IN_NODE", "1")
    assert distributed.world_info() == (3, 4, 1) and not distributed.is_main_process()


def test_shard_batches_gives_every_rank_the_same_number_of_batches():
    batches = [[i] for i in range(7)]
    shards = [distributed.shard_batches(batches, distributed.WorldInfo(r, 3, r)) for r in range(3)]
    assert shards == [[[0], [3]], [[1], [4]], [[2], [5]]]
    assert distributed.shard_batches(batches, distributed.WorldInfo(0, 1, 0)) == batches


def test_precision_flags_become_training_arguments():
    import argparse

    import paddle

    from mrc.errors import MRCError

    parser = distributed.add_precision_flags(argparse.ArgumentParser())
    assert distributed.precision_kwargs(parser.parse_args([])) == {"fp16": False, "bf16": False, "fp16_opt_level": "O1"}
    assert distributed.precision_kwargs(parser.parse_args(["--bf16"]))["bf16"] is True
    with pytest.raises(SystemExit):
        parser.parse_args(["--fp16", "--bf16"])
    fp16 = parser.parse_args(["--fp16", "--fp16_opt_level", "O2"])
    if paddle.is_compiled_with_cuda():
        assert distributed.precision_kwargs(fp16) == {"fp16": True, "bf16": False, "fp16_opt_level": "O2"}
    else:
        with pytest.raises(MRCError, match="--fp16 needs a CUDA build"):
            distributed.precision_kwargs(fp16)


def _rows(batch):
    return sorted(map(tuple, batch))


def _load(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def test_two_cpu_processes_match_one_process_on_the_union_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore"}
    for key in [k for k in env if k.startswith("PADDLE_")]:
        del env[key]  # never inherit a rank from an outer job
    dist_out, single_out, logs = tmp_path / "dist", tmp_path / "single", tmp_path / "launch_logs"
    dist = subprocess.Popen(
        [sys.executable, str(ROOT / "src" / "launch.py"), str(WORKER), "--nproc", str(RANKS), "--log_dir", str(logs),
         "--out", str(dist_out), "--batch_size", str(PER_RANK_BATCH), "--steps", str(STEPS)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    single = subprocess.run(
        [sys.executable, str(WORKER), "--out", str(single_out), "--batch_size", str(PER_RANK_BATCH * RANKS), "--steps", str(STEPS)],
        cwd=ROOT, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    dist_log, _ = dist.communicate(timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    worker_logs = "".join(f"\n--- {p.name}\n" + p.read_text(errors="replace")[-2000:] for p in sorted(logs.glob("workerlog.*")))
    assert dist.returncode == 0, dist_log[-2000:] + worker_logs

    # the launcher ran 2 gloo processes with one thread each
    assert sorted(p.name for p in logs.glob("workerlog.*")) == ["workerlog.0", "workerlog.1"]
    for rank in range(RANKS):
        envlog = (logs / f"envlog.{rank}").read_text()
        assert "PADDLE_DISTRI_BACKEND=gloo" in envlog and "OMP_NUM_THREADS=1" in envlog

    # each rank trained on its own half of every global batch; together they are the single run's batch
    runs = [json.loads((dist_out / f"batches_rank{r}.json").read_text()) for r in range(RANKS)]
    reference = json.loads((single_out / "batches_rank0.json").read_text())
    assert [r["trainer_world_size"] for r in runs] == [RANKS, RANKS] and reference["trainer_world_size"] == 1
    assert [r["should_save"] for r in runs] == [True, False]
    assert all(r["same_init_as_rank0"] for r in runs)  # main_process_first: rank 1 read what rank 0 wrote
    # any_rank: rank 1's True at step 1 reaches every rank, False stays False
    assert [r["votes"] for r in runs + [reference]] == [[[1, True, False], [2, False, False]]] * (RANKS + 1)
    for step in range(STEPS):
        halves = [_rows(r["batches"][step]) for r in runs]
        assert all(len(h) == PER_RANK_BATCH for h in halves)
        assert not set(halves[0]) & set(halves[1])
        assert _rows(halves[0] + halves[1]) == _rows(reference["batches"][step])

    # after all-reduced steps both ranks hold the same weights, equal to the single run's
    params = [_load(dist_out / f"params_rank{r}.npz") for r in range(RANKS)]
    expected, init = _load(single_out / "params_rank0.npz"), _load(dist_out / "init_params.npz")
    assert params[0].keys() == expected.keys() == init.keys()
    moved = 0.0
    for name, want in expected.items():
        np.testing.assert_array_equal(params[0][name], params[1][name], err_msg=name)
        np.testing.assert_allclose(params[0][name], want, rtol=1e-5, atol=1e-6, err_msg=name)
        assert np.linalg.norm(params[0][name] - want) <= 1e-5 * max(np.linalg.norm(want), 1e-6), name
        moved = max(moved, float(np.linalg.norm(want - init[name]) / max(np.linalg.norm(init[name]), 1e-6)))
    assert moved > 1e-2  # the 2 steps really changed the weights: the comparison above is not vacuous

    # only rank 0 wrote: its marker (is_main_process) and the Trainer checkpoint; rank 1 wrote nothing
    assert (dist_out / "main_marker_rank0.json").exists() and not (dist_out / "main_marker_rank1.json").exists()
    assert (dist_out / "trainer_rank0" / f"checkpoint-{STEPS}" / "model_state.pdparams").exists()
    assert [p for p in (dist_out / "trainer_rank1").rglob("*") if p.is_file()] == []


def test_barrier_waits_longer_than_gloos_30_seconds(tmp_path):
    """A rank 35 s late at a barrier (gloo's own collectives time out after 30 s): the others wait for it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONWARNINGS": "ignore"}
    for key in [k for k in env if k.startswith("PADDLE_")]:
        del env[key]
    logs = tmp_path / "logs"
    run = subprocess.run([sys.executable, str(ROOT / "src" / "launch.py"), str(ROOT / "tests" / "barrier_worker.py"), "--nproc", "2",
                          "--log_dir", str(logs), "--out", str(tmp_path / "out"), "--delay", "35"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    worker_logs = "".join(p.read_text(errors="replace")[-1500:] for p in sorted(logs.glob("workerlog.*")))
    assert run.returncode == 0, run.stdout[-1500:] + worker_logs
    times = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in range(2)]
    assert times[1]["left"] >= times[0]["arrived"] - 0.5  # rank 1 left only once rank 0 had come
