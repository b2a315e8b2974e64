"""Fine-tuning glue around paddlenlp's Trainer: datasets, length-bucketed batches, logits, one fold.

- `FeatureDataset` + `collate`: features from mrc.features, padded per batch (paddlenlp.data.Pad).
- `LengthBucketBatchSampler`: shuffle, cut into chunks of `chunk_batches` batches, sort each chunk
  by length, batch it, shuffle the batches: little padding, still random. Seeded by (seed, epoch).
- `predict_logits(model, features)`: the npz logits dict of mrc.postprocess (length-sorted batches,
  put back in feature order).
- `MRCTrainer`: evaluates with the official metric (threshold tuned on the eval questions) and
  selects checkpoints on it, and stops the run on a NaN/inf loss (mrc.callbacks.check_finite_loss);
  its checkpoints are marked complete (mrc.callbacks.CompleteCheckpoints).
- `InferenceReserve`: the time a fold keeps after training for its out-of-fold and dev passes, for
  mrc.callbacks.TimeBudget (which stops training at the wall-clock deadline, on every rank at once).
Data-parallel: every rank computes the same global batches and takes its share (mrc.distributed).
"""
from __future__ import annotations

import math
import os
import random
import time

import numpy as np
import paddle
from paddlenlp.data import Pad
from paddlenlp.trainer import Trainer, TrainerCallback

from . import metric, postprocess
from .callbacks import CHECKPOINT_DONE, CompleteCheckpoints, check_finite_loss  # noqa: F401  (CHECKPOINT_DONE: re-exported)
from .distributed import shard_batches, world_info
from .features import Features


class FeatureDataset(paddle.io.Dataset):
    def __init__(self, features: Features):
        self.features = features

    def __len__(self):
        return len(self.features)

    def __getitem__(self, i):
        f = self.features
        return {"input_ids": f.input_ids[i], "token_type_ids": f.token_type_ids[i],
                "start_positions": f.start_positions[i], "end_positions": f.end_positions[i],
                "answerable_label": f.answerable[i]}


_pad = Pad(axis=0, pad_val=0, dtype="int64")


def collate(batch: list[dict]) -> dict:
    input_ids = _pad([b["input_ids"] for b in batch])
    return {
        "input_ids": input_ids,
        "token_type_ids": _pad([b["token_type_ids"] for b in batch]),
        "attention_mask": (input_ids != 0).astype("float32"),
        "start_positions": np.array([b["start_positions"] for b in batch], dtype="int64"),
        "end_positions": np.array([b["end_positions"] for b in batch], dtype="int64"),
        "answerable_label": np.array([b["answerable_label"] for b in batch], dtype="int64"),
    }


class LengthBucketBatchSampler(paddle.io.BatchSampler):
    def __init__(self, lengths, batch_size: int, seed: int, chunk_batches: int = 50, drop_last=False):
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.chunk_batches, self.drop_last = batch_size, seed, chunk_batches, drop_last
        self.epoch = 0
        self._cached = (None, None)  # (epoch, batches)

    def set_epoch(self, epoch: int):
        self.epoch = int(epoch)

    def batches(self) -> list[list[int]]:
        if self._cached[0] != self.epoch:
            self._cached = (self.epoch, self._make_batches())
        return self._cached[1]

    def _make_batches(self) -> list[list[int]]:
        rng = random.Random(self.seed * 100003 + self.epoch)
        order = list(range(len(self.lengths)))
        rng.shuffle(order)
        chunk = self.batch_size * self.chunk_batches
        batches = []
        for c in range(0, len(order), chunk):
            part = sorted(order[c: c + chunk], key=lambda i: self.lengths[i])
            batches += [part[b: b + self.batch_size] for b in range(0, len(part), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        rng.shuffle(batches)
        return shard_batches(batches)  # data-parallel: this rank's 1/N (identity in a single process)

    def __iter__(self):
        yield from self.batches()

    def __len__(self):
        n = len(self.lengths) / self.batch_size
        global_batches = int(n) if self.drop_last else math.ceil(n)
        return global_batches // world_info().world_size


class SamplerEpoch(TrainerCallback):
    """Give the sampler the epoch number (also right after a resume, which skips whole epochs)."""

    def __init__(self, sampler: LengthBucketBatchSampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(math.floor((state.epoch or 0) + 1e-6))


class InferenceReserve:
    """Seconds a fold keeps after training for the `n_infer` windows still to forward (out-of-fold + dev
    passes): the `reserve` of mrc.callbacks.TimeBudget. Seconds per window as measured by the trainer's
    evaluations (`trainer.eval_seconds_per_feature`), `default_seconds_per_window` until the first one;
    20% margin. Set `.trainer` once the trainer exists."""

    def __init__(self, n_infer: int, default_seconds_per_window: float = 0.05):
        self.n_infer, self.default = n_infer, default_seconds_per_window
        self.trainer = None

    def __call__(self) -> float:
        per_window = getattr(self.trainer, "eval_seconds_per_feature", None) or self.default
        return 1.2 * self.n_infer * per_window

    def calibrate(self, model, features: Features, batch_size: int, n: int = 64):
        """Time the model on up to `n` of `features` (the fold's own evaluation windows) so the reserve is
        right from the first step: a fixed default is 3x too much for a small model and, on a short
        budget, stopped training before it began."""
        if not len(features):
            return
        subset = features.subset(range(min(n, len(features))))
        predict_logits(model, subset, batch_size)  # warm-up: the first call builds kernels
        t0 = time.time()
        predict_logits(model, subset, batch_size)
        self.default = (time.time() - t0) / len(subset)


def batched_logits(features: Features, batch_size: int, run_batch, desc: str | None = None) -> dict:
    """The npz logits dict of every feature: `run_batch(collated numpy batch) -> (start [B, L], end [B, L],
    answerable [B, 2])` over length-sorted batches (little padding), written back in feature order.
    Shared by the dynamic model (predict_logits) and the exported static one (mrc.export)."""
    from tqdm import tqdm

    order = np.argsort(features.lengths(), kind="stable")
    width = int(features.lengths().max()) if len(features) else 1
    n = len(features)
    start = np.full((n, width), postprocess.PAD_LOGIT, dtype=np.float32)
    end = np.full((n, width), postprocess.PAD_LOGIT, dtype=np.float32)
    answerable = np.zeros((n, 2), dtype=np.float32)
    dataset = FeatureDataset(features)
    for b in tqdm(range(0, n, batch_size), desc=desc or "logits", disable=desc is None, mininterval=10):
        idx = order[b: b + batch_size]
        s, e, a = run_batch(collate([dataset[i] for i in idx]))
        for row, i in enumerate(idx):
            length = len(features.input_ids[i])
            start[i, :length] = s[row, :length]
            end[i, :length] = e[row, :length]
        answerable[idx] = a
    return postprocess.make_logits(features.example_id, start, end, features.padded_offsets(width), answerable, features.key)


def predict_logits(model, features: Features, batch_size: int = 32, with_loss: bool = False, desc: str | None = None):
    """Forward every feature with the dynamic model; returns (npz logits dict, mean loss or None)."""
    loss_sum, was_training = [0.0], model.training

    def run_batch(batch):
        batch = {k: paddle.to_tensor(v) for k, v in batch.items()}
        labels = {k: batch.pop(k) for k in ("start_positions", "end_positions", "answerable_label")}
        if with_loss:
            loss, s, e, a = model(**batch, **labels)
            loss_sum[0] += float(loss) * int(s.shape[0])
        else:
            s, e, a = model(**batch)
        return s.numpy(), e.numpy(), a.numpy()

    model.eval()
    with paddle.no_grad():
        logits = batched_logits(features, batch_size, run_batch, desc)
    if was_training:
        model.train()
    n = len(features)
    return logits, (loss_sum[0] / n if with_loss and n else None)


def score_examples(logits: dict, df, post_cfg: dict) -> dict:
    contexts = dict(zip(df["id"].astype(str), df["context"]))
    return postprocess.example_scores(logits, contexts, n_best=post_cfg["n_best"],
                                      max_answer_tokens=post_cfg["max_answer_tokens"],
                                      max_answer_chars=post_cfg.get("max_answer_chars"))


def target_answers(scores: dict, df, post_cfg: dict) -> dict:
    """Spans for the target task (dev_public, a test file, `predict` input; never the training mix's out-of-fold
    questions) grown to post `expand_to` (postprocess.expand_answers). After the stacker, which was fitted on
    out-of-fold spans."""
    return postprocess.expand_answers(scores, dict(zip(df["id"].astype(str), df["context"])), post_cfg.get("expand_to"))


class MRCTrainer(CompleteCheckpoints, Trainer):
    """Trainer whose evaluation is the official metric on the held-out questions of the fold.

    eval_f1: official F1 with the no-answer threshold tuned on these questions (what the fold can
    reach); eval_select = eval_f1 - 1e-4 * eval_loss: checkpoints are chosen on F1, ties (e.g. a model
    still answering 'no answer' everywhere) broken by the lower loss.
    """

    def __init__(self, *args, train_sampler=None, eval_features=None, eval_df=None, post_cfg=None, modes=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_sampler, self.eval_features, self.eval_df = train_sampler, eval_features, eval_df
        self.post_cfg, self.modes = post_cfg, modes
        self.eval_seconds_per_feature = None

    def _get_train_sampler(self):
        return self.train_sampler

    def compute_loss(self, model, inputs, return_outputs=False):
        outputs = model(**inputs)
        check_finite_loss(outputs[0], self.state.global_step + 1, self._batch_desc(inputs))
        return (outputs[0], outputs) if return_outputs else outputs[0]

    def _batch_desc(self, inputs) -> str:
        """'<k> of epoch <e> (<n> windows, first feature <i>, question <id>)' for the NaN guard's message."""
        state, per_epoch = self.state, max(1, len(self.train_sampler)) if self.train_sampler is not None else 0
        desc = f"{state.global_step % per_epoch + 1} of epoch {math.floor(state.epoch or 0) + 1}" if per_epoch else str(state.global_step + 1)
        n = int(inputs["input_ids"].shape[0])
        sampler = self.train_sampler
        # the batch the sampler gives at this step (the Trainer draws the sampler's batches in order)
        if sampler is not None and per_epoch:
            batches = sampler.batches()
            i = state.global_step % per_epoch
            if i < len(batches) and len(batches[i]) == n:
                first = batches[i][0]
                features = getattr(self.train_dataset, "features", None)
                qid = f", question {features.example_id[first]}" if features is not None else ""
                return f"{desc} ({n} windows, first feature {first}{qid})"
        return f"{desc} ({n} windows)"

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        t0 = time.time()
        logits, loss = predict_logits(self.model, self.eval_features, self.args.per_device_eval_batch_size, with_loss=True)
        scores = score_examples(logits, self.eval_df, self.post_cfg)
        gold = metric.gold_from_examples(self.eval_df)
        tuned = postprocess.tune_threshold(scores, gold, self.modes)
        self.eval_seconds_per_feature = (time.time() - t0) / max(1, len(self.eval_features))
        metrics = {f"{metric_key_prefix}_loss": loss, f"{metric_key_prefix}_f1": tuned["F1"],
                   f"{metric_key_prefix}_em": tuned["EM"], f"{metric_key_prefix}_answered": tuned["answered"],
                   f"{metric_key_prefix}_select": tuned["F1"] - 1e-4 * min(loss, 1e3)}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics


def save_state_atomic(model, path):
    """paddle.save through a temp file + os.replace: a kill never leaves half a weights file."""
    tmp = f"{path}.tmp{os.getpid()}"
    paddle.save(model.state_dict(), tmp)
    os.replace(tmp, path)
