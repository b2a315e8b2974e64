"""Ensemble experiments into one submission: weights and no-answer threshold tuned on out-of-fold predictions.

    bash run.sh ensemble --exps bert ernie roberta --input dev_public.json --name ens3

Members (outputs/<exp>/, made by bash run.sh train) must share their folds (the same outputs/folds*.csv
assignment, the same out-of-fold question ids): otherwise one-line error. Members with the same
tokenizer and feature settings are fused by averaging logits; different tokenizers are fused at
character level (--fusion char, the default then) or by summing n-best answer-string probabilities
(--fusion nbest); see mrc/ensemble.py. Weights (a grid, unless --weights) and the no-answer mode and
threshold are tuned on the members' oof.npz with the official metric, never on --input.

Test logits: for the dev_public file, the folds' dev.npz; for any other file, the fold models are run
on it. Writes submissions/<name>.json ({id: answer or "no answer"}, every input id, atomically),
submissions/<name>.md (members, weights, threshold, CV scores, the command) and
outputs/ensemble/<name>/result.json (read by bash run.sh report). With gold answers in --input, the
official scores are printed.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402  (threads/MKL env before paddle)

import argparse  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import yaml  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, atomic_write_text, load_yaml_config, read_json  # noqa: E402

log = logging.getLogger("mrc.ensemble")


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh ensemble", description=__doc__.split("\n\n")[0])
    p.add_argument("--exps", nargs="+", required=True, help="experiment names (outputs/<exp>/)")
    p.add_argument("--weights", nargs="+", type=float, default=None,
                   help="one non-negative weight per experiment (default: tuned on out-of-fold predictions)")
    p.add_argument("--input", required=True, help="SQuAD/DuReader-format JSON to answer (a path, a file name of the "
                   "data dir such as dev_public.json, or a source name such as checklist_dev)")
    p.add_argument("--name", required=True, help="submission name: submissions/<name>.json and .md")
    p.add_argument("--fusion", default="auto", choices=["auto", "logits", "char", "nbest"],
                   help="auto: logits when every member has the same tokenizer/feature settings, else char")
    p.add_argument("--weight_step", type=float, default=0.25, help="grid step of the weight search (default 0.25)")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--data_dir", default=None, help="data root (default: $MRC_DATA_DIR or ../shared/data)")
    p.add_argument("--submissions_dir", default="submissions", help="where submissions go (default submissions/)")
    p.add_argument("--batch_size", type=int, default=32, help="windows per forward pass when models are run")
    return p


def _abs(path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def resolve_input(text: str, data_dir) -> Path:
    """A path; else a source name (checklist_dev); else a file name of the data dir (dev_public.json)."""
    from mrc import data

    path = Path(text)
    if path.is_file():
        return path.resolve()
    if text in data.SOURCES:
        return data.source_path(text, data_dir)
    for name, rel in data.SOURCES.items():
        if Path(rel).name == path.name and data.source_path(name, data_dir).is_file():
            return data.source_path(name, data_dir)
    raise MRCError(f"{text}: input file not found")


# ---------------------------------------------------------------- members
def load_member(exp: str, out_root: Path) -> dict:
    """An experiment's records and its folds' OOF logits; a clear error when training has not finished."""
    from mrc import postprocess
    from mrc.folds import trained_folds

    exp_dir = out_root / exp
    for needed in ("train_info.json", "threshold.json", "cv.json"):
        if not (exp_dir / needed).is_file():
            raise MRCError(f"{exp_dir}: no {needed}; finish training first (bash run.sh train --exp {exp})")
    info = read_json(exp_dir / "train_info.json")
    config = yaml.safe_load((exp_dir / "config.yaml").read_text(encoding="utf-8")) if (exp_dir / "config.yaml").is_file() else {}
    folds = trained_folds(info)
    oof = [postprocess.load_logits(exp_dir / f"fold{k}" / "oof.npz") for k in folds]
    return {"name": exp, "dir": exp_dir, "info": info, "config": config or {}, "threshold": read_json(exp_dir / "threshold.json"),
            "cv": read_json(exp_dir / "cv.json"), "oof": oof, "folds": folds}


def oof_examples(ids, data_dir):
    """The training questions behind the OOF ids ('<source>:<id>'): contexts and gold."""
    from mrc import data

    sources = sorted({i.split(":", 1)[0] for i in ids})
    unknown = [s for s in sources if s not in data.SOURCES]
    if unknown:
        raise MRCError(f"out-of-fold id source '{unknown[0]}' is not a known data source")
    df = data.load_sources(sources, data_dir)
    df = df[df["id"].isin(set(ids))].drop_duplicates("id")
    if len(df) != len(set(ids)):
        missing = sorted(set(ids) - set(df["id"]))
        raise MRCError(f"out-of-fold id {missing[0]}: not found in the data ({len(missing)} missing); other data dir?")
    return df


def member_test_logits(member: dict, df, input_path: Path, data_dir, batch_size: int) -> tuple[dict, str]:
    """The member's fold-averaged logits on the input (ids of the input file) and where they came from."""
    import numpy as np

    from mrc import data, postprocess
    from mrc.ensemble import fold_average

    exp_dir, folds, names = member["dir"], member["folds"], [f"{member['name']}/fold{k}" for k in member["folds"]]
    ids = set(df["id"].astype(str))
    dev_source = member["config"].get("dev_source", "checklist_dev")
    dev_path = data.source_path(dev_source, data_dir) if dev_source in data.SOURCES else None
    dev_files = [exp_dir / f"fold{k}" / "dev.npz" for k in folds]
    if dev_path is not None and dev_path.is_file() and input_path.samefile(dev_path) and all(f.is_file() for f in dev_files):
        fold_logits = [postprocess.load_logits(f) for f in dev_files]
        prefix = f"{dev_source}:"
        for lg in fold_logits:
            lg["example_id"] = np.array([str(i)[len(prefix):] if str(i).startswith(prefix) else str(i) for i in lg["example_id"]])
        if set(fold_logits[0]["example_id"]) == ids:
            return fold_average(fold_logits, names), "dev.npz of the folds"
        log.info("%s: dev.npz covers %d of the %d input questions: running the fold models instead",
                 member["name"], len(set(fold_logits[0]["example_id"])), len(ids))
    return run_fold_models(member, df, batch_size), "fold models run on the input"


def run_fold_models(member: dict, df, batch_size: int) -> dict:
    """Fold models of the experiment on df (predict.fold_logits), averaged as members are."""
    from mrc.ensemble import fold_average
    from predict import fold_logits

    exp_dir = member["dir"]
    for k in member["folds"]:  # before the slow imports: a clear line when a model is missing
        model_dir = exp_dir / f"fold{k}" / "model"
        if not (model_dir / "model_state.pdparams").is_file():
            raise MRCError(f"{model_dir}: fold model missing, needed to answer {len(df)} questions the folds' dev.npz "
                           f"do not cover")
    logits = fold_logits(exp_dir, member["info"], df, batch_size, label=f"{member['name']} ")
    return fold_average(logits, [f"{member['name']}/fold{k}" for k in member["folds"]])


# ---------------------------------------------------------------- main
def main(argv=None):
    args = build_parser().parse_args(argv)
    t0 = time.time()
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name):
        raise MRCError(f"--name {args.name!r}: use letters, digits, '_', '-', '.' only")
    if len(set(args.exps)) != len(args.exps):
        raise MRCError(f"--exps {' '.join(args.exps)}: an experiment is listed twice")
    defaults = load_yaml_config("configs/default.yaml")
    out_root = _abs(args.output_dir or defaults["output_dir"])
    data_dir = args.data_dir or defaults.get("data_dir")

    from mrc import answerability, data, ensemble, metric, postprocess
    from predict import check_complete

    input_path = resolve_input(args.input, data_dir)
    members = [load_member(exp, out_root) for exp in args.exps]
    names = [m["name"] for m in members]
    ensemble.check_aligned(names, [[lg["example_id"] for lg in m["oof"]] for m in members])
    weights = ensemble.normalize_weights(args.weights, len(members), names) if args.weights else None
    fusion = ensemble.resolve_fusion(args.fusion, [m["oof"][0] for m in members])
    post = members[0]["info"]["post"]
    modes = members[0]["config"].get("threshold_modes") or list(postprocess.MODEL_MODES)

    # 1. tune on out-of-fold predictions only
    oof_ids = sorted({str(i) for lg in members[0]["oof"] for i in lg["example_id"]})
    oof_df = oof_examples(oof_ids, data_dir)
    oof_gold = metric.gold_from_examples(oof_df)
    contexts = dict(zip(oof_df["id"].astype(str), oof_df["context"]))
    log.info("tuning %s on %d out-of-fold questions (%s fusion, %s)", "the threshold" if weights or len(members) == 1
             else "weights and threshold", len(oof_gold), fusion, f"weights {weights}" if weights else f"grid step {args.weight_step}")
    oof_hand = answerability.hand_feature_table(oof_df) if "stack" in modes else None
    tuned = ensemble.tune_on_oof([m["oof"] for m in members], oof_gold, contexts, post, fusion, modes, weights,
                                 args.weight_step, names, log=log, hand=oof_hand, seed=int(defaults.get("seed", 42)),
                                 target_unanswerable_share=members[0]["config"].get("target_unanswerable_share"))
    oof_pred = postprocess.decide(tuned.pop("scores"), tuned["threshold"], tuned["mode"])
    cv = metric.evaluate(oof_gold, oof_pred)
    cv_no_answer = metric.evaluate(oof_gold, {i: metric.NO_ANSWER for i in oof_gold})
    log.info("ensemble OOF F1 %.3f EM %.3f with weights %s (%s >= %.4g); 'no answer' everywhere F1 %.3f",
             cv["F1"], cv["EM"], [round(w, 3) for w in tuned["weights"]], tuned["mode"], tuned["threshold"], cv_no_answer["F1"])

    # 2. the test input: logits per member, one fusion, one decision
    gold = metric.load_gold(input_path)  # every question id, as the official script reads the file
    df, report = data.load_file(input_path)
    if report.total_skipped:
        skipped = [i for i in gold if i not in set(df["id"].astype(str))]
        raise MRCError(f"{input_path}: id {skipped[0] if skipped else '?'}: cannot be answered "
                       f"({report.total_skipped} questions rejected: {dict(report.skipped)})")
    test_logits, origins, active = [], [], [i for i, w in enumerate(tuned["weights"]) if w > 0]
    for i, m in enumerate(members):
        if i not in active:
            origins.append("not needed (weight 0)")
            continue
        lg, origin = member_test_logits(m, df, input_path, data_dir, args.batch_size)
        test_logits.append(lg)
        origins.append(origin)
        log.info("%s: test logits from %s", m["name"], origin)
    test_contexts = dict(zip(df["id"].astype(str), df["context"]))
    scores = ensemble.fuse_scores(test_logits, [tuned["weights"][i] for i in active], test_contexts, post, fusion,
                                  [names[i] for i in active])
    if tuned["stacker"] is not None:
        answerability.apply_stacker(scores, answerability.hand_feature_table(df), tuned["stacker"])
    scores = postprocess.expand_answers(scores, test_contexts, post.get("expand_to"))  # target-task answer shape
    predictions = postprocess.decide(scores, tuned["threshold"], tuned["mode"])
    predictions = {i: predictions[i] for i in gold if i in predictions}
    check_complete(predictions, list(gold), str(input_path))
    has_gold = any(g["answers"] or g["is_impossible"] for g in gold.values())
    test_metrics = metric.evaluate(gold, predictions) if has_gold else None
    test_no_answer = metric.evaluate(gold, {i: metric.NO_ANSWER for i in gold}) if has_gold else None

    sub_dir = _abs(args.submissions_dir)
    sub_path = sub_dir / f"{args.name}.json"
    atomic_write_json(sub_path, predictions)
    command = "bash run.sh ensemble " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    result = {
        "name": args.name, "fusion": fusion, "members": names, "weights": tuned["weights"],
        "weights_tuned": weights is None and len(members) > 1, "weight_grid": tuned["grid"],
        "threshold": {"mode": tuned["mode"], "threshold": tuned["threshold"], "tuned_on": "out-of-fold", "stacker": tuned["stacker"],
                      "target_unanswerable_share": tuned.get("target_unanswerable_share")},
        "cv": _short(cv), "cv_all_no_answer": _short(cv_no_answer),
        "member_cv": {m["name"]: m["cv"].get("cv") for m in members}, "member_dev": {m["name"]: m["cv"].get("dev") for m in members},
        "input": str(input_path), "test_logits": dict(zip(names, origins)),
        "test": _short(test_metrics) if test_metrics else None,
        "test_all_no_answer": _short(test_no_answer) if test_no_answer else None,
        "is_dev_public": _is_source(input_path, "checklist_dev", data_dir),
        "answered": int(sum(p != metric.NO_ANSWER for p in predictions.values())), "questions": len(predictions),
        "submission": str(sub_path), "command": command, "wall_seconds": round(time.time() - t0, 1),
    }
    atomic_write_json(out_root / "ensemble" / args.name / "result.json", result)
    atomic_write_text(sub_dir / f"{args.name}.md", render_markdown(result, members))
    log.info("%d questions, %d answered -> %s", len(predictions), result["answered"], sub_path)
    if test_metrics:
        import json

        print(json.dumps({"F1": round(test_metrics["F1"], 3), "EM": round(test_metrics["EM"], 3),
                          "checklist_F1": round(test_metrics["checklist_F1"], 3) if "checklist_F1" in test_metrics else None,
                          "no_answer_F1": round(test_no_answer["F1"], 3), "cv_F1": round(cv["F1"], 3)}, ensure_ascii=False))
    return 0


def _is_source(path: Path, name: str, data_dir) -> bool:
    from mrc import data

    other = data.source_path(name, data_dir)
    return other.is_file() and path.samefile(other)


def _short(result: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _fmt(x):
    return "-" if x is None else f"{x:.3f}"


def render_markdown(result: dict, members: list[dict]) -> str:
    th = result["threshold"]
    lines = [f"# Submission {result['name']}", "",
             f"- input: `{result['input']}` ({result['questions']} questions, {result['answered']} answered)",
             f"- fusion: {result['fusion']}; weights: " + ("tuned on out-of-fold predictions" if result["weights_tuned"]
                                                   else "one member" if len(members) == 1 else "given (--weights)"),
             f"- no-answer decision: mode `{th['mode']}`, threshold {th['threshold']:.6g} (tuned on out-of-fold predictions)",
             f"- command: `{result['command']}`", "",
             "| member | weight | feature key | backbone | CV F1 | CV EM | dev_public F1 | dev_public EM | test logits |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, w in zip(members, result["weights"]):
        cv, dev = m["cv"].get("cv") or {}, m["cv"].get("dev") or {}
        lines.append(f"| {m['name']} | {w:.3f} | `{_cell(m['info']['features']['feature_key'])}` | {m['info']['backbone'].get('kind')} "
                     f"{m['info']['backbone'].get('arch')} | {_fmt(cv.get('F1'))} | {_fmt(cv.get('EM'))} | {_fmt(dev.get('F1'))} | "
                     f"{_fmt(dev.get('EM'))} | {result['test_logits'][m['name']]} |")
    cv, na = result["cv"], result["cv_all_no_answer"]
    lines += ["", f"Ensemble CV (out-of-fold, {cv['TOTAL']} questions): F1 {cv['F1']:.3f}, EM {cv['EM']:.3f} "
              f"('no answer' everywhere: F1 {na['F1']:.3f})."]
    if result["test"]:
        t, tn = result["test"], result["test_all_no_answer"]
        lines.append(f"On the input (official metric): F1 {t['F1']:.3f}, EM {t['EM']:.3f}, checklist F1 "
                     f"{_fmt(t.get('checklist_F1'))} ('no answer' everywhere: F1 {tn['F1']:.3f}, EM {tn['EM']:.3f}).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    runtime.run_main(main)
