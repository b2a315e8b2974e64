"""Faster CPU training for paddle's nn.TransformerEncoder (the BERT and ERNIE encoders): same parameters, same maths.

Where a QA step's time went (paddle.profiler, seq 256, batch 16): paddle's CPU dropout kernel draws its mask one
element at a time (27 ms for the [16, 2, 256, 256] attention probabilities, which a multiply of the same tensor does
in 0.3 ms), about 15% of the step; the bias gradient of every Linear is a column sum, and paddle's CPU column sum
is slow (32 ms over [4096, 1024], where a GEMM with a row of ones takes 0.3 ms); the attention mask is broadcast-
added in each layer and every Linear reshapes (and its gradient copies) [batch, seq, hidden]. `speed_up_for_cpu`
rebinds forwards and leaves parameters and state dict alone (checkpoints load and save as before):
  - dropout (every nn.Dropout and the attention probabilities): the keep mask drawn in bulk by numpy, uint16
    draws against a threshold (keep probability within 1e-5 of 1 - p); its seed comes from paddle's generator, so
    paddle.seed and the Trainer's saved RNG state still fix it;
  - the encoder's layers run on [batch * seq, hidden] rows; every Linear is GemmLinear (addmm forward, three
    GEMMs backward), q, k and v one of them over the three weights side by side, 1/sqrt(d) folded into q's;
  - the attention mask expanded to [batch, heads, seq, seq] once per forward, not broadcast in each layer;
  - every nn.LayerNorm (the layers' and the embeddings'): paddle's CPU layer_norm backward takes 18 ms over
    [4096, 256] where its forward takes 0.5 ms; RowLayerNorm's backward (GEMM column sums) halves the pair
    (QA step at seq 256, one thread: 2.09 -> 1.98 s).
A cache, attention weights or hidden states asked for, pre-norm layers, recompute and GPU runs keep paddle's forward.
"""
from __future__ import annotations

import logging
import math
import types

import numpy as np
import paddle
import paddle.nn as nn
from paddle.autograd import PyLayer

log = logging.getLogger("mrc.fast_encoder")
_UINT16 = 1 << 16


def on_cpu() -> bool:
    return paddle.get_device().startswith("cpu")


def bulk_dropout(x, p: float, training: bool = True):
    """Inverted dropout (upscale in training) with the keep mask drawn by numpy in bulk; seeded from paddle's generator."""
    if not training or p <= 0:
        return x
    threshold = int(round(p * _UINT16))
    seed = int(paddle.randint(0, 2**31 - 1, [1]).item())
    keep = np.random.default_rng(seed).integers(0, _UINT16, size=x.shape, dtype=np.uint16) >= threshold
    mask = paddle.scale(paddle.to_tensor(keep).astype(x.dtype), _UINT16 / (_UINT16 - threshold))  # no gradient
    return x * mask


def _dropout_forward(self, x):
    return bulk_dropout(x, self.p, self.training)


class GemmLinear(PyLayer):
    """rows @ weight + bias (addmm); in backward the bias gradient is a GEMM with a row of ones: paddle's CPU column
    sum (what Linear's and addmm's gradients use) takes 32 ms over [4096, 1024] where the GEMM takes 0.3 ms."""

    @staticmethod
    def forward(ctx, rows, weight, bias):
        ctx.save_for_backward(rows, weight)
        ctx.needs = [not t.stop_gradient for t in (rows, weight, bias)]
        return paddle.addmm(bias, rows, weight)

    @staticmethod
    def backward(ctx, grad):
        rows, weight = ctx.saved_tensor()
        d_rows = paddle.matmul(grad, weight, transpose_y=True) if ctx.needs[0] else None
        d_weight = paddle.matmul(rows, grad, transpose_x=True) if ctx.needs[1] else None
        d_bias = paddle.matmul(paddle.ones([1, grad.shape[0]], grad.dtype), grad).reshape([-1]) if ctx.needs[2] else None
        return d_rows, d_weight, d_bias


class RowLayerNorm(PyLayer):
    """Layer norm over the last axis whose backward takes half the time of paddle's CPU kernel ([4096, 256] rows,
    forward + backward: 9 ms vs 19 ms): the scale and shift gradients are column sums, done as GEMMs with a row of
    ones (see GemmLinear), and the input gradient is the textbook row-wise formula."""

    @staticmethod
    def forward(ctx, x, weight, bias, epsilon):
        centred = x - x.mean(axis=-1, keepdim=True)
        inv_std = paddle.rsqrt((centred * centred).mean(axis=-1, keepdim=True) + epsilon)
        normed = centred * inv_std
        ctx.save_for_backward(normed, inv_std, weight)
        ctx.needs = [not t.stop_gradient for t in (x, weight, bias)]
        return normed * weight + bias

    @staticmethod
    def backward(ctx, grad):
        normed, inv_std, weight = ctx.saved_tensor()
        width = grad.shape[-1]
        ones = paddle.ones([1, math.prod(grad.shape[:-1])], grad.dtype)
        d_weight = paddle.matmul(ones, (grad * normed).reshape([-1, width])).reshape([-1]) if ctx.needs[1] else None
        d_bias = paddle.matmul(ones, grad.reshape([-1, width])).reshape([-1]) if ctx.needs[2] else None
        d_x = None
        if ctx.needs[0]:
            d_normed = grad * weight
            d_x = (d_normed - d_normed.mean(axis=-1, keepdim=True)
                   - normed * (d_normed * normed).mean(axis=-1, keepdim=True)) * inv_std
        return d_x, d_weight, d_bias


def _layer_norm_forward(self, x):
    return RowLayerNorm.apply(x, self.weight, self.bias, self._epsilon)


def _attention(attn: nn.MultiHeadAttention, rows, mask, b: int, s: int):
    """Self-attention over [b * s, hidden] rows; returns rows."""
    heads, d = attn.num_heads, attn.head_dim
    scale = d**-0.5
    weight = paddle.concat([attn.q_proj.weight * scale, attn.k_proj.weight, attn.v_proj.weight], axis=1)
    bias = paddle.concat([attn.q_proj.bias * scale, attn.k_proj.bias, attn.v_proj.bias])
    # split, not slicing (each slice's gradient fills a zero tensor of the whole projection); contiguous after the
    # transpose: the attention matmuls get contiguous operands (this block forward + backward at seq 256: 98 ms vs 127)
    q, k, v = (t.reshape([b, s, heads, d]).transpose([0, 2, 1, 3]).contiguous()
               for t in paddle.split(GemmLinear.apply(rows, weight, bias), 3, axis=-1))
    product = paddle.matmul(q, k, transpose_y=True)
    if mask is not None:
        product = product + mask
    weights = bulk_dropout(nn.functional.softmax(product), attn.dropout, attn.training)
    out = paddle.matmul(weights, v).transpose([0, 2, 1, 3]).reshape([b * s, heads * d])
    return GemmLinear.apply(out, attn.out_proj.weight, attn.out_proj.bias)


def _layer(layer: nn.TransformerEncoderLayer, rows, mask, b: int, s: int):
    """paddle's post-norm TransformerEncoderLayer.forward, on rows."""
    rows = layer.norm1(rows + layer.dropout1(_attention(layer.self_attn, rows, mask, b, s)))
    hidden = layer.dropout(layer.activation(GemmLinear.apply(rows, layer.linear1.weight, layer.linear1.bias)))
    return layer.norm2(rows + layer.dropout2(GemmLinear.apply(hidden, layer.linear2.weight, layer.linear2.bias)))


def _fast_layer_ok(layer) -> bool:
    attn = layer.self_attn
    linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, layer.linear1, layer.linear2)
    return not layer.normalize_before and all(lin.bias is not None for lin in linears)


def fast_encoder_forward(self, src, src_mask=None, cache=None, output_attentions=False, output_hidden_states=False,
                         return_dict=False):
    # every argument spelled out: paddlenlp wraps a forward assigned without them into one that drops them
    plain = (cache is None and not (output_attentions or output_hidden_states or return_dict) and on_cpu()
             and not getattr(self, "_use_cache", False) and not getattr(self, "enable_recompute", False)
             and all(_fast_layer_ok(layer) for layer in self.layers))
    if not plain:
        return self._paddle_forward(src, src_mask=src_mask, cache=cache, output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states, return_dict=return_dict)
    from paddle.nn.layer.transformer import _convert_attention_mask

    b, s, h = src.shape
    mask = None
    if src_mask is not None:  # expanded once: a same-shape add in each layer (paddle's broadcast add is ~2x slower)
        mask = paddle.expand(_convert_attention_mask(src_mask, src.dtype), [b, self.layers[0].self_attn.num_heads, s, s])
    rows = src.reshape([b * s, h])  # the layers work on rows: no reshape (and reshape gradient copy) per Linear
    for layer in self.layers:
        rows = _layer(layer, rows, mask, b, s)
    out = rows.reshape([b, s, h])
    return self.norm(out) if self.norm is not None else out


def speed_up_for_cpu(model: nn.Layer) -> dict:
    """Rebind the forwards described above inside `model`; counts of what was rebound (all zero off the CPU)."""
    counts = {"encoder_layers": 0, "dropouts": 0, "layer_norms": 0}
    if not on_cpu():
        return counts
    for layer in model.sublayers(include_self=True):
        if hasattr(layer, "_paddle_forward"):
            continue
        if isinstance(layer, nn.TransformerEncoder):
            layer._paddle_forward, layer.forward = layer.forward, types.MethodType(fast_encoder_forward, layer)
            counts["encoder_layers"] += len(layer.layers)
        elif isinstance(layer, nn.Dropout) and layer.mode == "upscale_in_train" and layer.axis is None:
            layer._paddle_forward, layer.forward = layer.forward, types.MethodType(_dropout_forward, layer)
            counts["dropouts"] += 1
        elif (isinstance(layer, nn.LayerNorm) and len(layer._normalized_shape) == 1 and layer.weight is not None
              and layer.bias is not None):
            layer._paddle_forward, layer.forward = layer.forward, types.MethodType(_layer_norm_forward, layer)
            counts["layer_norms"] += 1
    log.info("CPU fast paths (mrc.fast_encoder): %d encoder layers, %d dropout layers, %d layer norms", counts["encoder_layers"],
             counts["dropouts"], counts["layer_norms"])
    return counts
