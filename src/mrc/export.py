"""Export a trained fold model to a Paddle inference model, and run it with paddle.inference.

    export_fold_model(fold_dir, arch, out_dir) -> prefix      (paddle.jit.save of SpanAnswerableModel)
    InferenceRunner(prefix, mkldnn=True, threads=2, bf16=False)(input_ids, token_type_ids) -> (start, end, answerable)
    static_fold_logits(fold_dir, arch, features, batch_size) -> npz logits dict (predict --static), exporting
        to fold_dir/inference/ first when that is missing or older than the fold's weights

The exported graph takes (input_ids, token_type_ids) [batch, length] int64, both dims dynamic, and
returns (start_logits [B, L], end_logits [B, L], answerable_logits [B, 2]) exactly as the dynamic model
in eval mode (the attention mask is derived from input_ids != 0 inside, as SpanAnswerableModel does).
Paddle 3 writes <prefix>.json (PIR program) + <prefix>.pdiparams; older versions <prefix>.pdmodel.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import MRCError

MODEL_FILES = (".json", ".pdmodel")  # PIR (Paddle 3) program, legacy program


def export_fold_model(fold_dir, arch: str, out_dir, model=None) -> Path:
    """Save fold_dir/model (config.json + model_state.pdparams) as a static inference model in
    out_dir/inference.*; returns the path prefix. `model`: an already loaded fold model (skips loading)."""
    import paddle
    from paddle.static import InputSpec

    if model is None:
        from .model import load_fold_model

        model = load_fold_model(Path(fold_dir), arch)
    model.eval()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / "inference"
    specs = [InputSpec([None, None], "int64", name="input_ids"), InputSpec([None, None], "int64", name="token_type_ids")]
    static = paddle.jit.to_static(_inference_layer(model), input_spec=specs, full_graph=True)
    paddle.jit.save(static, str(prefix))
    if inference_model_file(prefix) is None:
        raise MRCError(f"{out_dir}: paddle.jit.save wrote no inference program")
    return prefix


def inference_model_file(prefix) -> Path | None:
    for suffix in MODEL_FILES:
        path = Path(f"{prefix}{suffix}")
        if path.is_file():
            return path
    return None


def _inference_layer(model):
    """A Layer taking only (input_ids, token_type_ids): the inputs the exported program is fed."""
    import paddle

    class InferenceLayer(paddle.nn.Layer):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, token_type_ids):
            return self.inner(input_ids, token_type_ids=token_type_ids)

    return InferenceLayer(model)


class InferenceRunner:
    """A paddle.inference predictor of an exported model (MKLDNN/oneDNN on or off). bf16=True runs oneDNN's bfloat16
    kernels (weights and activations rounded to bf16, fp32 accumulation): 1.4x the questions/s on this AVX512-BF16 CPU,
    logits within ~0.05 of fp32 (README "Performance"); CPUs without bf16 instructions emulate it slowly."""

    def __init__(self, prefix, mkldnn: bool = True, threads: int = 2, bf16: bool = False):
        import paddle.inference as pi

        model_file = inference_model_file(prefix)
        params_file = Path(f"{prefix}.pdiparams")
        if model_file is None or not params_file.is_file():
            raise MRCError(f"{prefix}: no exported inference model (.json/.pdmodel + .pdiparams); run export_fold_model")
        config = pi.Config(str(model_file), str(params_file))
        config.disable_gpu()
        config.set_cpu_math_library_num_threads(int(threads))
        if bf16 and not mkldnn:
            raise MRCError(f"{prefix}: bf16 inference runs on oneDNN (mkldnn=True)")
        if mkldnn:
            config.enable_mkldnn()
            if bf16:
                config.enable_onednn_bfloat16()
        else:
            config.disable_mkldnn()
        config.disable_glog_info()
        self.predictor = pi.create_predictor(config)
        self.input_names = self.predictor.get_input_names()
        self.output_names = self.predictor.get_output_names()

    def __call__(self, input_ids: np.ndarray, token_type_ids: np.ndarray):
        feeds = {"input_ids": input_ids, "token_type_ids": token_type_ids}
        for i, name in enumerate(self.input_names):  # by name; by position if a Paddle version renamed them
            value = feeds.get(name, (input_ids, token_type_ids)[i])
            self.predictor.get_input_handle(name).copy_from_cpu(np.ascontiguousarray(value, dtype=np.int64))
        self.predictor.run()
        return tuple(self.predictor.get_output_handle(n).copy_to_cpu() for n in self.output_names)


def static_fold_logits(fold_dir, arch: str, features, batch_size: int = 32, desc: str | None = None,
                       threads: int | None = None, bf16: bool = False) -> dict:
    """The fold model's logits on `features` through its exported program (the same numbers as
    mrc.finetune.predict_logits up to float rounding). The export is cached in fold_dir/inference/."""
    import os

    from .finetune import batched_logits

    fold_dir = Path(fold_dir)
    weights = fold_dir / "model" / "model_state.pdparams"
    prefix = fold_dir / "inference" / "inference"
    program = inference_model_file(prefix)
    if program is None or not weights.is_file() or program.stat().st_mtime < weights.stat().st_mtime:
        prefix = export_fold_model(fold_dir, arch, fold_dir / "inference")
    runner = InferenceRunner(prefix, threads=threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1), bf16=bf16)
    return batched_logits(features, batch_size, lambda batch: runner(batch["input_ids"], batch["token_type_ids"]), desc)
