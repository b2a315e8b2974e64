"""mrc.fast_encoder: the CPU training forward computes what paddle's does, with the same parameters."""
import numpy as np
import paddle
import pytest
from paddlenlp.transformers import BertConfig, BertModel, ErnieConfig, ErnieModel

from mrc.fast_encoder import RowLayerNorm, bulk_dropout, speed_up_for_cpu
from mrc.model import SpanAnswerableModel


def twin_models(arch, dropout=0.0):
    config_cls, model_cls = {"bert": (BertConfig, BertModel), "ernie": (ErnieConfig, ErnieModel)}[arch]
    paddle.seed(0)
    config = config_cls(vocab_size=120, hidden_size=48, num_hidden_layers=2, num_attention_heads=3, intermediate_size=96,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, type_vocab_size=2, pad_token_id=0)
    plain = SpanAnswerableModel(model_cls(config), dropout=dropout)
    fast = SpanAnswerableModel(model_cls(config), dropout=dropout)
    fast.set_state_dict(plain.state_dict())
    return plain, fast


def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(5, 120, size=(3, 17))
    ids[1, 11:] = 0  # a padded row: the mask path matters
    ids = paddle.to_tensor(ids)
    return dict(input_ids=ids, token_type_ids=paddle.to_tensor((rng.rand(3, 17) > 0.5).astype("int64")),
                attention_mask=(ids != 0).astype("float32"), start_positions=paddle.to_tensor([1, 2, 0]),
                end_positions=paddle.to_tensor([3, 2, 0]), answerable_label=paddle.to_tensor([1, 1, 0]))


@pytest.mark.parametrize("arch", ["bert", "ernie"])
def test_fast_forward_gives_paddles_logits_and_gradients(arch):
    plain, fast = twin_models(arch)
    counts = speed_up_for_cpu(fast)
    assert counts["encoder_layers"] == 2 and counts["dropouts"] > 0
    assert counts["layer_norms"] == 5  # two per layer and the embeddings'
    assert list(fast.state_dict()) == list(plain.state_dict())  # checkpoints unchanged
    inputs = batch()
    outputs = {}
    for name, model in (("plain", plain), ("fast", fast)):
        model.train()
        out = model(**inputs)
        out[0].backward()
        outputs[name] = ([t.numpy() for t in out], {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None})
    (plain_out, plain_grads), (fast_out, fast_grads) = outputs["plain"], outputs["fast"]
    for a, b in zip(plain_out, fast_out):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert set(fast_grads) == set(plain_grads)
    for name, grad in plain_grads.items():
        np.testing.assert_allclose(fast_grads[name], grad, rtol=1e-4, atol=1e-6, err_msg=name)


def test_attention_weights_requested_fall_back_to_paddles_forward():
    plain, fast = twin_models("ernie")
    speed_up_for_cpu(fast)
    ids = batch()["input_ids"]
    got = fast.encoder(ids, output_attentions=True, return_dict=True)
    want = plain.encoder(ids, output_attentions=True, return_dict=True)
    assert len(got.attentions) == 2
    np.testing.assert_allclose(got.attentions[0].numpy(), want.attentions[0].numpy(), rtol=1e-6)


def test_bulk_dropout_keeps_one_minus_p_scaled_and_follows_paddle_seed():
    x = paddle.ones([1000, 1000])
    paddle.seed(7)
    first = bulk_dropout(x, 0.1).numpy()
    second = bulk_dropout(x, 0.1).numpy()
    paddle.seed(7)
    again = bulk_dropout(x, 0.1).numpy()
    kept = first != 0
    assert abs(kept.mean() - 0.9) < 0.002
    np.testing.assert_allclose(first[kept], 1 / 0.9, rtol=1e-4)  # upscaled in training: the mean is kept
    assert abs(first.mean() - 1.0) < 0.003
    np.testing.assert_array_equal(first, again)  # paddle.seed fixes the mask
    assert (first != second).mean() > 0.1  # each call draws a new one
    assert bulk_dropout(x, 0.1, training=False) is x and bulk_dropout(x, 0.0) is x


def test_dropout_layers_in_eval_mode_are_the_identity():
    _, fast = twin_models("bert", dropout=0.3)
    speed_up_for_cpu(fast)
    fast.eval()
    inputs = {k: batch()[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    first, second = fast(**inputs)[0].numpy(), fast(**inputs)[0].numpy()
    np.testing.assert_array_equal(first, second)
    fast.train()
    assert not np.array_equal(fast(**inputs)[0].numpy(), first)


def test_row_layer_norm_matches_the_formula_and_paddles_layer_norm():
    rng = np.random.RandomState(1)
    x_np, dy_np = rng.randn(2, 5, 8) * 3 + 1, rng.randn(2, 5, 8)
    weight_np, bias_np = rng.rand(8) + 0.5, np.arange(8) / 10
    centred = x_np - x_np.mean(-1, keepdims=True)
    inv_std = 1 / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
    normed = centred * inv_std
    d_normed = dy_np * weight_np
    want = {"y": normed * weight_np + bias_np,
            "x": (d_normed - d_normed.mean(-1, keepdims=True) - normed * (d_normed * normed).mean(-1, keepdims=True)) * inv_std,
            "weight": (dy_np * normed).sum((0, 1)), "bias": dy_np.sum((0, 1))}

    def run(layer_norm, frozen_weight):
        x = paddle.to_tensor(x_np.astype("float32"), stop_gradient=False)
        weight = paddle.to_tensor(weight_np.astype("float32"), stop_gradient=frozen_weight)
        bias = paddle.to_tensor(bias_np.astype("float32"), stop_gradient=False)
        y = layer_norm(x, weight, bias)
        (y * paddle.to_tensor(dy_np.astype("float32"))).sum().backward()
        return {"y": y, "x": x.grad, "weight": weight.grad, "bias": bias.grad}

    rows = lambda x, w, b: RowLayerNorm.apply(x, w, b, 1e-5)  # noqa: E731
    paddles = lambda x, w, b: paddle.nn.functional.layer_norm(x, [8], w, b, 1e-5)  # noqa: E731
    for got in (run(rows, False), run(paddles, False)):
        for key, value in want.items():
            np.testing.assert_allclose(got[key].numpy(), value, rtol=1e-4, atol=1e-5, err_msg=key)
    frozen = run(rows, True)  # a frozen scale gets no gradient and still scales the input's
    assert frozen["weight"] is None
    np.testing.assert_allclose(frozen["x"].numpy(), want["x"], rtol=1e-4, atol=1e-5)
    # (paddle 3.3.1's own CPU layer_norm computes the input gradient as if a frozen scale were all ones)
