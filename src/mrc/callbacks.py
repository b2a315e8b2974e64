"""Trainer pieces shared by pre-training and fine-tuning: a wall-clock budget and a finite-loss guard."""
import logging
import math
import time

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
