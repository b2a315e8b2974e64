"""The *ForPretraining models of each architecture, with MLM logits computed only at masked positions.

BertForPretraining / ErnieForPretraining take `masked_positions` (flattened over batch*length) and gather
before the vocab projection; AlbertForPretraining has no such argument, so its heads are applied here to
the gathered hidden states — same idea, the [B, L, V] logits are never built.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

log = logging.getLogger("mrc.pretrain_model")


def pretraining_classes(arch: str) -> SimpleNamespace:
    from paddlenlp import transformers as T

    table = {
        "bert": (T.BertConfig, T.BertModel, T.BertForPretraining),
        "ernie": (T.ErnieConfig, T.ErnieModel, T.ErnieForPretraining),
        "albert": (T.AlbertConfig, T.AlbertModel, T.AlbertForPretraining),
    }
    if arch not in table:
        raise ValueError(f"unknown architecture {arch!r} (expected one of {', '.join(table)})")
    config, model, pretraining = table[arch]
    return SimpleNamespace(config=config, model=model, pretraining=pretraining)


def new_pretraining_model(arch: str, sizes: dict, vocab_size: int, pad_token_id: int):
    """Random init of a small config (configs/models/offline_sizes.yaml) with the project's vocab."""
    classes = pretraining_classes(arch)
    kwargs = dict(sizes, vocab_size=vocab_size, pad_token_id=pad_token_id)
    if arch == "albert":
        kwargs.setdefault("embedding_size", min(128, sizes["hidden_size"]))
    else:
        kwargs.setdefault("type_vocab_size", 2)
    return tie_output_embeddings(classes.pretraining(classes.config(**kwargs)), arch)


def tie_output_embeddings(model, arch: str):
    """ALBERT's MLM decoder is the word-embedding matrix (as in the paper and HF). paddlenlp 2.8.1 never ties it
    (neither in __init__, a TODO there, nor in from_pretrained): untied, the random-init ALBERT learned far slower
    (held-out MLM 0.053 against 0.092 tied after 1500 cpu-profile steps). BERT and ERNIE pass the embedding matrix
    to their heads and are tied already."""
    if arch == "albert":
        model.tie_weights()
    return model


def pretraining_logits(model, arch: str, batch: dict):
    """(MLM logits [M, V] at batch['masked_positions'], pair logits [B, 2] (NSP or SOP))."""
    import paddle

    inputs = dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                  attention_mask=batch["attention_mask"])
    if arch == "albert":
        sequence_output, pooled_output = model.transformer(**inputs, return_dict=False)[:2]
        hidden = paddle.gather(sequence_output.reshape([-1, sequence_output.shape[-1]]), batch["masked_positions"])
        return model.predictions(hidden), model.sop_classifier(pooled_output)
    outputs = model(**inputs, masked_positions=batch["masked_positions"], return_dict=False)
    return outputs[0], outputs[1]
