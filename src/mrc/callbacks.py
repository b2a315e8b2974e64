"""Trainer pieces shared by pre-training and fine-tuning: a wall-clock budget, a finite-loss guard and
checkpoints that count only once complete (a `checkpoint.done` marker written last; resume from the newest
marked one)."""
import logging
import math
import os
import re
import shutil
import time
from pathlib import Path

from paddlenlp.trainer import TrainerCallback

from .errors import MRCError

log = logging.getLogger("mrc.train")


class TimeBudget(TrainerCallback):
    """Stop once time.time() passes `deadline`, saving (and evaluating, if asked) first, so a rerun
    resumes from there. With `eval_at_end`, the last planned step is evaluated and saved too, so the end
    of training competes for the best checkpoint.

    `reserve` (optional): a callable giving the seconds still needed after training (e.g. inference
    passes timed by the evaluations); the effective deadline is `deadline - reserve()`, re-read at every
    step. Data-parallel: the stop decision is taken on every rank at every step together
    (mrc.distributed.any_rank), so no rank stops alone."""

    def __init__(self, deadline: float | None, eval_at_end: bool = False, reserve=None):
        self.end = deadline
        self.eval_at_end = eval_at_end
        self.reserve = reserve
        self.stopped_early = False

    @property
    def deadline(self) -> float | None:
        if self.end is None:
            return None
        return self.end - (self.reserve() if self.reserve is not None else 0.0)

    @deadline.setter
    def deadline(self, value: float | None):
        self.end = value

    def on_step_end(self, args, state, control, **kwargs):
        from .distributed import any_rank

        deadline = self.deadline
        # a collective: every rank reaches it at every step (deadline None or not is the same everywhere)
        late = deadline is not None and any_rank(time.time() >= deadline)
        if self.eval_at_end and state.global_step >= state.max_steps:
            control.should_evaluate = control.should_save = True
        elif late and not control.should_training_stop:
            log.info("time budget reached at step %d of %d: stopping", state.global_step, state.max_steps)
            self.stopped_early = True
            control.should_training_stop = control.should_save = True
            control.should_evaluate = self.eval_at_end
        return control


def check_finite_loss(loss, step: int, batch: str = ""):
    """Stop the run on a NaN/inf loss, naming the step and the batch (a diverged run wastes CPU hours)."""
    value = float(loss)
    if not math.isfinite(value):
        raise MRCError(f"loss is {value} at step {step}{', batch ' + batch if batch else ''}: "
                       "training diverged (lower the learning rate or check the inputs)")
    return value


CHECKPOINT_DONE = "checkpoint.done"  # written into checkpoint-<step>/ once paddlenlp has saved everything there


def mark_checkpoint_complete(trainer):
    """Write CHECKPOINT_DONE into the trainer's checkpoint of the current step (on the saving rank)."""
    if trainer.args.should_save:
        from .io_utils import atomic_write_text

        step = trainer.state.global_step
        atomic_write_text(os.path.join(trainer.args.output_dir, f"checkpoint-{step}", CHECKPOINT_DONE), f"{step}\n")


class CompleteCheckpoints:
    """Mixin for a paddlenlp Trainer (`class T(CompleteCheckpoints, Trainer)`): every checkpoint is marked
    complete once written, and old ones are rotated (save_total_limit) also in a single CPU process."""

    def _save_checkpoint(self, model, metrics=None):
        super()._save_checkpoint(model, metrics=metrics)
        # paddlenlp writes the checkpoint's files in place: mark it complete, so a run killed while
        # saving resumes from the previous one (last_complete_checkpoint)
        mark_checkpoint_complete(self)
        # paddlenlp 2.8.1 rotates (save_total_limit) only when local_rank == 0, which a single CPU
        # process (-1) never is: rotate here; the best checkpoint is kept by _sorted_checkpoints
        # (data-parallel: local_rank >= 0, paddlenlp rotates on local rank 0 and the others must not)
        if self.args.local_rank < 0:
            self._rotate_checkpoints(use_mtime=False, output_dir=self.args.output_dir)


def last_complete_checkpoint(checkpoint_dir, remove_incomplete: bool = True) -> str | None:
    """The newest checkpoint-<step> dir under `checkpoint_dir` holding CHECKPOINT_DONE; a newer, half-written
    one (the run was killed while saving) is logged and, with `remove_incomplete` (rank 0 only), removed."""
    found = sorted((int(m.group(1)), p) for p in Path(checkpoint_dir).glob("checkpoint-*")
                   if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name)))
    for _, path in reversed(found):
        if (path / CHECKPOINT_DONE).is_file():
            return str(path)
        log.warning("%s: incomplete checkpoint (killed while saving?), not resuming from it%s", path,
                    "; removing it" if remove_incomplete else "")
        if remove_incomplete:
            shutil.rmtree(path, ignore_errors=True)
    return None
