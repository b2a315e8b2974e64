"""Run a training stage data-parallel through Paddle's own launcher (python -m paddle.distributed.launch).

    python src/launch.py {pretrain|train|path/to/script.py} [launcher flags] [stage flags]

Launcher flags (the rest goes to the stage unchanged):
  --gpus 0,1,2,3      one process per listed GPU (NCCL)
  --nproc N           N CPU processes on this machine (gloo backend), one thread each
  --nnodes N          number of machines; run the same command on each of them ...
  --master IP:PORT    ... with the rendezvous address of the first machine
  --node_rank R       this machine's rank (optional: the master assigns one)
  --ips IP1,IP2       Paddle's older multi-machine form (all machine IPs; deprecated by Paddle)
  --log_dir DIR       per-process logs (default outputs/<stage>/launch_logs/<time>/); the console
                      shows rank 0, workerlog.<k> holds rank k

Every process runs the stage script; paddlenlp's Trainer shards the data per rank and all-reduces the
gradients, and only rank 0 writes (Trainer: args.should_save; the rest: mrc.distributed.is_main_process).
`bash run.sh pretrain|train ...` comes here when one of the launcher flags is present.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mrc import runtime  # noqa: E402  (logging; MRCError -> one line on stderr)

import argparse  # noqa: E402
import importlib.metadata  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.errors import MRCError  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGE_SCRIPTS = {"pretrain": "src/pretrain.py", "train": "src/train.py"}
# run.sh routes a pretrain/train call here when any of these is present (keep the two lists in sync)
LAUNCH_FLAGS = ("--gpus", "--nproc", "--nnodes", "--master", "--node_rank", "--ips")

log = logging.getLogger("mrc")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python src/launch.py", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0],
                                epilog="Stage flags: bash run.sh <stage> --help.")
    p.add_argument("stage", help="pretrain | train | a .py script")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpus", type=gpu_list, default=None, help="GPU ids, e.g. 0,1,2,3 (one process each)")
    where.add_argument("--nproc", type=positive_int, default=None, help="number of CPU processes on this machine")
    p.add_argument("--nnodes", type=positive_int, default=None, help="number of machines (default 1)")
    p.add_argument("--master", type=host_port, default=None, help="rendezvous IP:PORT (multi-machine)")
    p.add_argument("--node_rank", type=int, default=None, help="rank of this machine (default: assigned by the master)")
    p.add_argument("--ips", default=None, help="comma-separated machine IPs (Paddle's deprecated multi-machine form)")
    p.add_argument("--log_dir", default=None, help="per-process log dir (default outputs/<stage>/launch_logs/<time>)")
    return p


def gpu_list(text: str) -> str:
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise argparse.ArgumentTypeError(f"expected GPU ids like 0,1,2,3, got {text!r}")
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def host_port(text: str) -> str:
    if not re.fullmatch(r"[^\s:]+:\d+", text):
        raise argparse.ArgumentTypeError(f"expected IP:PORT, got {text!r}")
    return text


def stage_script(stage: str) -> str:
    if stage in STAGE_SCRIPTS:
        return str(REPO_ROOT / STAGE_SCRIPTS[stage])
    if stage.endswith(".py"):
        return stage
    raise argparse.ArgumentTypeError(f"unknown stage {stage!r}: expected {' | '.join(STAGE_SCRIPTS)} or a .py script")


def parse(argv: list[str]):
    """(launcher args, the stage's own argv); a bad launcher flag exits 2 with the usage."""
    parser = build_parser()
    args, stage_args = parser.parse_known_args(argv)
    try:
        args.script = stage_script(args.stage)
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    if args.gpus is None and args.nproc is None and args.nnodes is None and args.master is None and args.ips is None:
        parser.error("give --gpus LIST or --nproc N (and --nnodes/--master or --ips for several machines)")
    return args, stage_args


def build_command(args, stage_args: list[str], python: str = sys.executable, cpu_count: int | None = None,
                  now: float | None = None) -> tuple[list[str], dict[str, str]]:
    """(the command to exec, environment variables to set for it)."""
    script = args.script
    stage_name = args.stage if args.stage in STAGE_SCRIPTS else Path(args.stage).stem
    log_dir = args.log_dir or str(REPO_ROOT / "outputs" / stage_name / "launch_logs"
                                  / time.strftime("%Y%m%d-%H%M%S", time.localtime(now)))

    cmd = [python, "-m", "paddle.distributed.launch", "--log_dir", log_dir]
    env = {}
    cores = cpu_count or os.cpu_count() or 1
    if args.gpus is not None:
        cmd += ["--devices", args.gpus]
        # the GPU does the math; share the cores among this machine's processes for data loading
        env["OMP_NUM_THREADS"] = str(max(1, cores // len(args.gpus.split(","))))
    if args.nproc is not None:
        # No --devices: on a CPU build the launcher then starts gloo processes (PADDLE_DISTRI_BACKEND=gloo).
        # One thread per process: N processes x 1 thread beat 1 process x N threads (measured, 2 cores).
        cmd += ["--nproc_per_node", str(args.nproc)]
        env["OMP_NUM_THREADS"] = "1"
    if args.nnodes is not None:
        cmd += ["--nnodes", str(args.nnodes)]
    if args.master is not None:
        cmd += ["--master", args.master]
    if args.node_rank is not None:
        cmd += ["--rank", str(args.node_rank)]
    if args.ips is not None:
        cmd += ["--ips", args.ips]
    cmd += [script, *stage_args]
    return cmd, env


def check_cpu_build():
    """--nproc means CPU processes; a GPU build of Paddle that sees GPUs would put them on GPUs instead."""
    try:
        importlib.metadata.version("paddlepaddle-gpu")
    except importlib.metadata.PackageNotFoundError:
        return  # CPU build: importing paddle to ask would cost seconds
    import paddle

    if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        raise MRCError("--nproc starts CPU processes, but this Paddle build sees "
                       f"{paddle.device.cuda.device_count()} GPU(s): use --gpus 0,1,... instead")


def main(argv=None):
    args, stage_args = parse(sys.argv[1:] if argv is None else argv)
    if args.nproc is not None:
        check_cpu_build()
    cmd, env = build_command(args, stage_args)
    os.environ.update(env)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    log.info("launch: %s%s", " ".join(f"{k}={v}" for k, v in env.items()) + " " if env else "", " ".join(cmd))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    runtime.run_main(main)
