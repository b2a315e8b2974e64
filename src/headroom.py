"""Headroom of a trained experiment on dev_public: the F1 better spans or a better no-answer decision could reach.

    bash run.sh headroom --exp ernie [--input other_labelled.json --logits fold_avg.npz]

Reads the experiment's fold models' dev logits (outputs/<exp>/fold<k>/dev.npz, averaged as train does) or, for
another labelled file, the logits `bash run.sh predict --logits_out` wrote for it. Prints one table (mrc.headroom:
answer spans x decision values, each with the best threshold chosen on the questions themselves, an upper
bound) and writes it to outputs/<exp>/headroom.{md,json}. No model is run.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402

import argparse  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, atomic_write_text, load_yaml_config, read_json  # noqa: E402

log = logging.getLogger("mrc.headroom")


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh headroom", description=__doc__.split("\n\n")[0])
    p.add_argument("--exp", required=True, help="experiment name (outputs/<exp>/, made by bash run.sh train)")
    p.add_argument("--input", default=None, help="a labelled SQuAD/DuReader-format file (default: the experiment's dev source)")
    p.add_argument("--logits", default=None, help="with --input: its logits npz (bash run.sh predict --logits_out)")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--data_dir", default=None, help="data root (default: $MRC_DATA_DIR or ../shared/data)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    if bool(args.input) != bool(args.logits):
        raise MRCError("--input and --logits go together (the logits of that file's questions)")
    defaults = load_yaml_config("configs/default.yaml")
    out_root = Path(args.output_dir or defaults["output_dir"])
    exp_dir = out_root if out_root.is_absolute() else REPO_ROOT / out_root
    exp_dir = exp_dir / args.exp
    for needed in ("train_info.json", "config.yaml"):
        if not (exp_dir / needed).is_file():
            raise MRCError(f"{exp_dir}: no {needed}; train it first (bash run.sh train --exp {args.exp})")

    from mrc import answerability, data, headroom, metric, postprocess
    from mrc.finetune import score_examples

    info, cfg = read_json(exp_dir / "train_info.json"), load_yaml_config(exp_dir / "config.yaml")
    data_dir = data.resolve_data_dir(args.data_dir or cfg.get("data_dir"))
    if args.input:
        df, _ = data.load_file(args.input)
        logits = postprocess.load_logits(args.logits)
    else:
        from mrc.sampling import cap

        # the questions train scored: the same cap and seed
        df = cap(data.labelled(data.load_sources([cfg["dev_source"]], data_dir)), cfg.get("dev_max_questions"), int(cfg["seed"]))
        logits = postprocess.average_logits([postprocess.load_logits(exp_dir / f"fold{k}" / "dev.npz") for k in info["trained_folds"]],
                                            names=[f"fold{k}/dev.npz" for k in info["trained_folds"]])
    df = data.labelled(df)
    if df.empty:
        raise MRCError(f"{args.input or cfg['dev_source']}: no labelled questions to measure headroom on")
    gold = metric.gold_from_examples(df)
    scores = score_examples(logits, df, info["post"])
    result = headroom.headroom(scores, dict(zip(df["id"].astype(str), df["context"])), gold,
                               answerability.hand_feature_table(df), metric, seed=int(cfg.get("seed", 42)))
    actual = None
    if not args.input and (exp_dir / "cv.json").is_file():
        actual = read_json(exp_dir / "cv.json").get("dev", {}).get("F1")
    text = headroom.markdown(result, actual)
    atomic_write_json(exp_dir / "headroom.json", {**result, "input": args.input or cfg["dev_source"], "run_F1": actual})
    atomic_write_text(exp_dir / "headroom.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    runtime.run_main(main)
