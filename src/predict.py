"""Answer every question of a SQuAD/DuReader-format file with an experiment's fold models.

    bash run.sh predict --exp ernie_cpu --input dev_public.json --output pred.json

The fold models' logits are averaged (mrc.postprocess.average_logits), spans picked per question and
the no-answer decision made with the experiment's threshold.json (mrc.postprocess.decide). Every
input id gets an answer (a span or 'no answer'); the file is written atomically, and only when no id
is missing. With gold answers in the input, the official metric is printed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402  (threads/MKL env before paddle)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, load_yaml_config, read_json  # noqa: E402

log = logging.getLogger("mrc.predict")


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--exp", required=True, help="experiment name (outputs/<exp>/, made by bash run.sh train)")
    p.add_argument("--input", required=True, help="SQuAD/DuReader-format JSON file (answers optional)")
    p.add_argument("--output", required=True, help="where to write {id: answer} JSON")
    p.add_argument("--logits_out", default=None, help="also write the fold-averaged per-window logits (npz) here")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--batch_size", type=int, default=32, help="windows per forward pass (default 32)")
    p.add_argument("--static", action="store_true",
                   help="run the folds' exported static graphs through paddle.inference (exported on first use to "
                        "fold<k>/inference/; ~2x the questions/s of the dynamic graph here, same answers)")
    p.add_argument("--bf16", action="store_true",
                   help="with --static: oneDNN bfloat16 kernels (1.4x the questions/s on CPUs with AVX512-BF16; logits "
                        "within ~0.05 of fp32, so an answer near the threshold can flip)")
    return p


def fold_logits(exp_dir: Path, info: dict, df, batch_size: int, label: str = "", static: bool = False,
                bf16: bool = False) -> list[dict]:
    """Per-window logits of each fold model of an experiment on the questions of df (same features
    as in training: the experiment's tokenizer and feature settings, checked by feature key).
    static=True runs each fold's exported inference program (mrc.export; exported once, reused); bf16 in bfloat16."""
    from mrc.export import static_fold_logits
    from mrc.features import build_features
    from mrc.finetune import predict_logits
    from mrc.model import load_fold_model
    from mrc.vocab import fast_tokenizer, load_tokenizer

    feat = info["features"]
    fast = fast_tokenizer(load_tokenizer(str(exp_dir / "tokenizer")))
    features = build_features(df, fast, feat["max_len"], feat["stride"], feat["use_title"], feat.get("match_types", False))
    if features.key != feat["feature_key"]:
        raise MRCError(f"{exp_dir}/tokenizer: feature key {features.key} differs from the trained one {feat['feature_key']}")
    from mrc.folds import trained_folds

    logits = []
    for k in trained_folds(info):
        if static:
            logits.append(static_fold_logits(exp_dir / f"fold{k}", info["backbone"]["arch"], features, batch_size,
                                             desc=f"{label}fold {k} (static{', bf16' if bf16 else ''})", bf16=bf16))
            continue
        model = load_fold_model(exp_dir / f"fold{k}", info["backbone"]["arch"])
        logits.append(predict_logits(model, features, batch_size, desc=f"{label}fold {k}")[0])
    return logits


def check_complete(predictions: dict, ids, where: str):
    """Validator: every input id has a string answer, and nothing else is there."""
    missing = [i for i in ids if not isinstance(predictions.get(i), str)]
    if missing:
        raise MRCError(f"{where}: id {missing[0]}: no prediction ({len(missing)} ids missing); nothing written")
    extra = set(predictions) - set(ids)
    if extra:
        raise MRCError(f"{where}: id {sorted(extra)[0]}: prediction for an id not in the input")


def main(argv=None):
    args = build_parser().parse_args(argv)
    defaults = load_yaml_config("configs/default.yaml")
    out_root = Path(args.output_dir or defaults["output_dir"])
    out_root = out_root if out_root.is_absolute() else REPO_ROOT / out_root
    exp_dir = out_root / args.exp
    for needed in ("train_info.json", "threshold.json"):
        if not (exp_dir / needed).is_file():
            raise MRCError(f"{exp_dir}: no {needed}; train it first (bash run.sh train --exp {args.exp})")
    if args.batch_size < 1:
        raise MRCError(f"--batch_size must be positive, got {args.batch_size}")
    if args.bf16 and not args.static:
        raise MRCError("--bf16 runs the exported static graphs: add --static")

    from mrc import data, metric, postprocess
    from mrc.finetune import score_examples, target_answers
    from mrc.io_utils import atomic_write_json

    info, threshold = read_json(exp_dir / "train_info.json"), read_json(exp_dir / "threshold.json")
    # gold answers play no part in predicting: only a structural problem (missing id/question/context,
    # duplicate id, wrong types) keeps a question out, and then nothing is written
    df, report = data.load_file(args.input, with_answers=False)
    if report.total_skipped:
        first = next(iter(report.examples.values()))
        raise MRCError(f"{first} ({report.total_skipped} questions cannot be read: {dict(report.skipped)}); nothing written")
    ids = df["id"].astype(str).tolist()
    if info["features"]["feature_key"] != threshold.get("feature_key", info["features"]["feature_key"]):
        raise MRCError(f"{exp_dir}/threshold.json: tuned for features {threshold['feature_key']}, not {info['features']['feature_key']}")
    members = fold_logits(exp_dir, info, df, args.batch_size, static=args.static, bf16=args.bf16)
    logits = postprocess.average_logits(members, names=[f"fold{k}" for k in range(len(members))])
    scores = score_examples(logits, df, info["post"])
    if threshold.get("stacker"):
        from mrc import answerability

        answerability.apply_stacker(scores, answerability.hand_feature_table(df), threshold["stacker"])
    scores = target_answers(scores, df, info["post"])
    predictions = postprocess.decide(scores, threshold["threshold"], threshold["mode"])
    check_complete(predictions, ids, args.input)
    if args.logits_out:
        postprocess.save_logits(args.logits_out, logits)
    atomic_write_json(args.output, predictions)
    answered = sum(p != metric.NO_ANSWER for p in predictions.values())
    log.info("%d questions, %d answered, %d 'no answer' (%s >= %.4g) -> %s", len(predictions), answered,
             len(predictions) - answered, threshold["mode"], threshold["threshold"], args.output)
    try:
        gold = metric.load_gold(args.input)  # gold answers as the official script reads them
    except MRCError as err:
        log.warning("no official metric: %s", err)
        return 0
    if any(g["answers"] or g["is_impossible"] for g in gold.values()):
        result = metric.evaluate(gold, predictions)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    runtime.run_main(main)
