"""Worker of tests/test_distributed.py: a few steps of paddlenlp's Trainer on a tiny random BERT.

Run it under `python -m paddle.distributed.launch --nproc_per_node 2` (each rank gets its own share of
the data from the Trainer's DistributedBatchSampler, gradients are all-reduced) or alone with
`--batch_size` = the global batch (the reference). Every rank dumps its parameters to
<out>/params_rank<k>.npz and the batches it trained on to <out>/batches_rank<k>.json; rank 0 alone
writes <out>/init_params.npz (inside main_process_first: the others read it back) and
<out>/main_marker_rank<k>.json (via is_main_process). Each rank gets
its own Trainer output dir <out>/trainer_rank<k>/ (real runs share one) so the test can see that the
Trainer writes its checkpoint on rank 0 only.
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from mrc import runtime  # noqa: E402,F401  (threads/MKL env before paddle)

import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddle.io import Dataset, DistributedBatchSampler  # noqa: E402
from paddlenlp.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddlenlp.transformers import BertConfig, BertForSequenceClassification  # noqa: E402

from mrc.distributed import any_rank, finish, is_main_process, main_process_first, world_info  # noqa: E402
from mrc.io_utils import atomic_save_npz, atomic_write_json  # noqa: E402

VOCAB, SEQ_LEN = 64, 12


class TinyDataset(Dataset):
    """Random token sequences; label = whether token 5 appears (something learnable, fixed by seed)."""

    def __init__(self, n, seed=0):
        rng = np.random.RandomState(seed)
        self.ids = rng.randint(1, VOCAB, size=(n, SEQ_LEN)).astype("int64")
        self.labels = (self.ids == 5).any(axis=1).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class ReferenceTrainer(Trainer):
    """Single process: the sampler the Trainer uses with N ranks, as one rank with an N-times batch.
    Same shuffle (RandomState(epoch) over the same indices), so global batch k is the union of the
    ranks' batches k."""

    def _get_train_sampler(self):
        return DistributedBatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                       shuffle=True, num_replicas=1, rank=0)


class Votes(TrainerCallback):
    """At every step end, a collective vote: True only on the last rank at step 1 (any_rank must make it
    True everywhere), and False everywhere."""

    def __init__(self, rank, world_size):
        self.rank, self.world_size, self.votes = rank, world_size, []

    def on_step_end(self, args, state, control, **kwargs):
        mine = self.rank == self.world_size - 1 and state.global_step == 1
        self.votes.append([state.global_step, any_rank(mine), any_rank(False)])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batch_size", type=int, required=True, help="per process")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--examples", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()
    out = Path(args.out)
    info = world_info()

    paddle.seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, num_labels=2,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    init = {n: p.numpy() for n, p in model.state_dict().items()}
    with main_process_first():  # rank 0 writes the file, the others find it there afterwards
        if is_main_process():
            atomic_save_npz(out / "init_params.npz", **init)
        with np.load(out / "init_params.npz") as saved:
            same_init = all(np.array_equal(saved[n], a) for n, a in init.items())
    # Plain SGD: the update is linear in the gradient, so all-reduce order noise stays ~1e-7.
    optimizer = paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters())
    targs = TrainingArguments(
        output_dir=str(out / f"trainer_rank{info.rank}"), per_device_train_batch_size=args.batch_size, max_steps=args.steps,
        seed=0, save_strategy="steps", save_steps=args.steps, logging_steps=1, max_grad_norm=0.0,
        dataloader_num_workers=0, disable_tqdm=True, report_to=["none"])
    trainer_cls = Trainer if info.world_size > 1 else ReferenceTrainer
    votes = Votes(info.rank, info.world_size)
    trainer = trainer_cls(model=model, args=targs, train_dataset=TinyDataset(args.examples), optimizers=(optimizer, None),
                          callbacks=[votes])
    seen = []  # the example ids of every batch this rank trained on
    original = trainer.training_step

    def recording_step(model, inputs, *a, **k):
        seen.append(inputs["input_ids"].numpy().tolist())
        return original(model, inputs, *a, **k)

    trainer.training_step = recording_step
    trainer.train()

    params = {name: p.numpy() for name, p in model.state_dict().items()}
    atomic_save_npz(out / f"params_rank{info.rank}.npz", **params)
    atomic_write_json(out / f"batches_rank{info.rank}.json",
                      {"rank": info.rank, "world_size": info.world_size, "trainer_world_size": targs.world_size,
                       "should_save": bool(targs.should_save), "same_init_as_rank0": same_init,
                       "votes": votes.votes,
                       "batches": seen})
    if is_main_process():
        atomic_write_json(out / f"main_marker_rank{info.rank}.json", {"rank": info.rank, "pid": os.getpid()})
    finish()  # all ranks together; skips Paddle's exit-time teardown (see mrc.distributed.finish)


if __name__ == "__main__":
    runtime.run_main(main)
