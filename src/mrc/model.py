"""Span + answerability head on a paddlenlp encoder (as the official DuReader-checklist baseline).

start/end logits: a linear layer on every token of the sequence output.
answerable logits: a linear layer on the pooled [CLS] output ([unanswerable, answerable]).
loss = (CE(start) + CE(end)) / 2 + CE(answerable), labels from mrc.features (span on [CLS] = index 0
when the window does not hold the answer).
"""
from __future__ import annotations

import math

import paddle
import paddle.nn as nn
import paddle.nn.functional as F


class SpanAnswerableModel(nn.Layer):
    def __init__(self, encoder, dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        self.dropout = nn.Dropout(dropout)
        self.span = nn.Linear(hidden, 2)
        self.answerable = nn.Linear(hidden, 2)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                start_positions=None, end_positions=None, answerable_label=None):
        if attention_mask is None:
            attention_mask = (input_ids != 0).astype("float32")
        outputs = self.encoder(input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
        sequence, pooled = outputs[0], outputs[1]
        if pooled is None:  # encoders without a pooler: the [CLS] vector
            pooled = sequence[:, 0]
        span_logits = self.span(self.dropout(sequence))
        start_logits, end_logits = span_logits[:, :, 0], span_logits[:, :, 1]
        # padding can never be a start or end
        pad = (1.0 - attention_mask.astype(start_logits.dtype)) * -1e4
        start_logits, end_logits = start_logits + pad, end_logits + pad
        answerable_logits = self.answerable(self.dropout(pooled))
        if start_positions is None:
            return start_logits, end_logits, answerable_logits
        loss = span_answerable_loss(start_logits, end_logits, answerable_logits,
                                    start_positions, end_positions, answerable_label)
        return loss, start_logits, end_logits, answerable_logits


def span_answerable_loss(start_logits, end_logits, answerable_logits, start_positions, end_positions, answerable_label):
    span = (F.cross_entropy(start_logits, start_positions.reshape([-1, 1]))
            + F.cross_entropy(end_logits, end_positions.reshape([-1, 1]))) / 2
    return span + F.cross_entropy(answerable_logits, answerable_label.reshape([-1, 1]))


def extend_token_types(encoder, n_types: int) -> bool:
    """Grow the encoder's token-type embedding to `n_types` rows (mrc.features match types); new rows
    start as copies of row 1 (the passage segment) so a pre-trained encoder starts where it was. Updates
    the config, so the saved checkpoint reloads with the same shape. True when it grew."""
    old = encoder.embeddings.token_type_embeddings
    rows, width = old.weight.shape
    if rows >= n_types:
        return False
    new = nn.Embedding(n_types, width)
    passage_row = old.weight[min(1, rows - 1):][:1]
    with paddle.no_grad():
        new.weight.set_value(paddle.concat([old.weight] + [passage_row] * (n_types - rows), axis=0))
    encoder.embeddings.token_type_embeddings = new
    encoder.config.type_vocab_size = n_types
    return True


def count_parameters(model: nn.Layer) -> int:
    return int(sum(math.prod(p.shape) for p in model.parameters()))


def load_fold_model(fold_dir, arch: str) -> SpanAnswerableModel:
    """SpanAnswerableModel of one fold from fold<k>/model/{config.json, model_state.pdparams} (the config
    records the token-type rows, so match-type models come back with them), in eval mode."""
    from pathlib import Path

    from .backbone import arch_classes
    from .errors import MRCError, first_line

    model_dir = Path(fold_dir) / "model"
    weights = model_dir / "model_state.pdparams"
    if not weights.is_file() or not (model_dir / "config.json").is_file():
        raise MRCError(f"{model_dir}: fold model missing (config.json + model_state.pdparams); has training finished?")
    classes = arch_classes(arch)
    try:
        encoder = classes.model(classes.config.from_pretrained(str(model_dir)))
    except Exception as err:
        raise MRCError(f"{model_dir}/config.json: cannot build the {arch} model ({first_line(err)})") from None
    model = SpanAnswerableModel(encoder)
    try:
        state = paddle.load(str(weights))
    except Exception as err:  # a truncated or foreign file: pickle/protobuf errors of many kinds
        raise MRCError(f"{weights}: cannot read the weights ({first_line(err)})") from None
    if not isinstance(state, dict):
        raise MRCError(f"{weights}: not a state dict (got {type(state).__name__})")
    missing = sorted(set(model.state_dict()) - set(state))
    if missing:
        raise MRCError(f"{weights}: weights do not fit the model (missing {', '.join(missing[:3])})")
    model.set_state_dict(state)
    model.eval()
    return model
