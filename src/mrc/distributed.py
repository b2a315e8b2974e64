"""Who am I in a data-parallel job started by `python -m paddle.distributed.launch` (see src/launch.py).

The launcher gives every worker its rank in the environment (PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
PADDLE_RANK_IN_NODE), so these helpers work before paddle is imported or the process group exists.
A plain `python src/train.py` has none of them: rank 0 of 1, and every helper is a no-op.

paddlenlp's Trainer already saves checkpoints and the model on rank 0 only (`args.should_save`); use
`is_main_process()` for everything else a stage writes (metrics, OOF npz, config, caches).

Mixed precision on GPUs is paddlenlp's (TrainingArguments fp16 / bf16 / fp16_opt_level): stages expose it
with `add_precision_flags(parser)` and pass `**precision_kwargs(args)` to their TrainingArguments.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NamedTuple


class WorldInfo(NamedTuple):
    rank: int  # global rank, 0 .. world_size-1
    world_size: int
    local_rank: int  # rank on this machine


def world_info() -> WorldInfo:
    env = os.environ
    rank = int(env.get("PADDLE_TRAINER_ID", env.get("PADDLE_GLOBAL_RANK", "0")) or 0)
    world_size = int(env.get("PADDLE_TRAINERS_NUM", env.get("PADDLE_GLOBAL_SIZE", "1")) or 1)
    local_rank = int(env.get("PADDLE_RANK_IN_NODE", env.get("PADDLE_LOCAL_RANK", str(rank))) or 0)
    return WorldInfo(rank, world_size, local_rank)


def is_distributed() -> bool:
    return world_info().world_size > 1


def is_main_process() -> bool:
    """True on global rank 0 (and in a single-process run): the one process that writes shared files."""
    return world_info().rank == 0


def ensure_process_group():
    """Create the default process group (NCCL on GPU, gloo on CPU) if the launcher started us and nobody
    did yet. paddlenlp's TrainingArguments does the same and skips it when already done."""
    if not is_distributed():
        return
    import paddle.distributed as dist
    from paddle.distributed.parallel import parallel_helper

    if not parallel_helper._is_parallel_ctx_initialized():
        dist.init_parallel_env()


_barrier_count = 0


def barrier(timeout_seconds: float = 3 * 3600):
    """Wait for every rank (no-op in a single process).

    Not dist.barrier(): on CPU that is a gloo collective, and gloo gives up after 30 seconds
    ("gloo/transport/tcp/unbound_buffer.cc TIMEOUT"), while ranks can reach a barrier minutes apart
    (one finishes its inference pass sooner). Each rank instead adds 1 to a counter in the launcher's
    TCP store (the one init_parallel_env rendezvoused through; it works across machines) and polls it.
    Rank 0 hosts that store, so it leaves every barrier last."""
    global _barrier_count
    if not is_distributed():
        return
    import time

    from paddle.base import core

    ensure_process_group()
    store = core.create_or_get_global_tcp_store()
    _barrier_count += 1
    key = f"mrc_barrier/{_barrier_count}"
    deadline, world = time.time() + timeout_seconds, world_info().world_size

    def wait_for(counter):
        while store.add(counter, 0) < world:
            if time.time() > deadline:
                raise RuntimeError(f"barrier {counter}: the other ranks did not arrive within {timeout_seconds:.0f} s")
            time.sleep(0.2)

    store.add(key, 1)
    wait_for(key)
    # rank 0 serves the store: it leaves last, or a rank still polling would find the store gone
    store.add(key + "/left", 1)
    if world_info().rank == 0:
        wait_for(key + "/left")


@contextlib.contextmanager
def main_process_first():
    """Rank 0 runs the block first (e.g. builds a vocab or a feature cache on disk), the others run it
    afterwards and find the result there. Every rank must enter the block (it holds two barriers)."""
    if not is_main_process():
        barrier()
    try:
        yield
    finally:
        if is_main_process():
            barrier()


def any_rank(flag: bool) -> bool:
    """True on every rank if `flag` is True on any rank. For decisions that must agree, e.g. a wall-clock
    budget: if one rank stopped training alone, the others would wait forever in the next all-reduce.
    Every rank must call it at the same point (it is a collective)."""
    if not is_distributed():
        return bool(flag)
    import paddle
    import paddle.distributed as dist

    ensure_process_group()
    votes = paddle.to_tensor([1.0 if flag else 0.0], dtype="float32")
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return bool(votes.item() > 0)


def finish(code: int = 0):
    """End a launched worker once its work is written: wait for every rank, flush, and leave with
    os._exit, skipping interpreter teardown. Paddle 3.3.1's gloo workers sometimes die with SIGABRT in
    that teardown, silently, after all output was written (rank 0 in 2 of 16 two-process CPU runs here;
    0 of 25 with this), and the launcher then reports the whole job as failed. Call it on every rank,
    on success only (a failing rank just exits and the launcher stops the others). No-op in a single
    process."""
    if not is_distributed():
        return
    barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shard_batches(batches: list, info: WorldInfo | None = None) -> list:
    """This rank's share of a list of global batches that every rank computed identically (same seed):
    batch i goes to rank i % world_size, cut to a multiple of world_size so every rank makes the same
    number of steps (a rank with one step more would wait forever in the gradient all-reduce)."""
    info = info or world_info()
    if info.world_size <= 1:
        return list(batches)
    usable = len(batches) - len(batches) % info.world_size
    return list(batches[info.rank:usable:info.world_size])


def add_precision_flags(parser):
    """--fp16 / --bf16 / --fp16_opt_level on a stage's argparse parser (paddlenlp AMP; for GPUs)."""
    group = parser.add_argument_group("mixed precision (GPU; paddlenlp TrainingArguments)")
    which = group.add_mutually_exclusive_group()
    which.add_argument("--fp16", action="store_true", help="float16 automatic mixed precision with loss scaling (CUDA GPUs)")
    which.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision (Ampere or newer GPUs)")
    group.add_argument("--fp16_opt_level", choices=["O1", "O2"], default="O1",
                       help="O1: per-op white/black lists (default); O2: float16 weights, float32 master weights")
    return parser


def precision_kwargs(args) -> dict:
    """TrainingArguments keywords for the flags of add_precision_flags."""
    fp16, bf16 = bool(getattr(args, "fp16", False)), bool(getattr(args, "bf16", False))
    if fp16:
        import paddle

        if not paddle.is_compiled_with_cuda():
            from .errors import MRCError

            # paddlenlp 2.8.1's loss scaler only works on GPUs (on CPU it fails at the first step)
            raise MRCError("--fp16 needs a CUDA build of Paddle and a GPU (this one is CPU-only)")
    return {"fp16": fp16, "bf16": bf16, "fp16_opt_level": getattr(args, "fp16_opt_level", "O1")}
