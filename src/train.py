"""Fine-tune a span + no-answer model with K folds; out-of-fold and dev_public logits; CV score.

    bash run.sh train --model ernie --profile cpu --folds 2 --max_minutes 20

Writes outputs/<exp>/: fold<k>/{model/, oof.npz, dev.npz, metrics.json}, threshold.json (no-answer
decision tuned on all out-of-fold predictions), cv.json (official CV and dev_public scores next to
answering 'no answer' everywhere), dev_predictions.json, train_info.json, config.yaml + metrics.json.
A killed run resumes: finished folds (fold<k>/metrics.json) are skipped, an unfinished fold goes on
from its last Trainer checkpoint.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402  (threads/MKL env before paddle)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.distributed import add_precision_flags, precision_kwargs  # noqa: E402
from mrc.errors import MRCError, first_line  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, load_yaml_config  # noqa: E402

log = logging.getLogger("mrc.train")


def parse_bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh train", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="bert | ernie | roberta | albert | a hub name | a checkpoint dir (default: configs/train.yaml model)")
    p.add_argument("--profile", default="cpu", choices=["tiny", "cpu", "full"], help="size profile (configs/train.yaml); default cpu")
    p.add_argument("--folds", type=int, default=None, help="number of folds (default: the profile's)")
    p.add_argument("--train_folds", type=int, default=None, help="train only the first N of the folds (default: all)")
    p.add_argument("--exp", default=None, help="experiment name: outputs/<exp>/ (default <model>_<profile>)")
    p.add_argument("--use_title", type=parse_bool, default=None, help="put the title after the question: true|false")
    p.add_argument("--match_types", type=parse_bool, default=None, help="DrQA exact-match token types (mrc.features): true|false")
    p.add_argument("--offline_size", default=None, help="random-init size from configs/models/offline_sizes.yaml (default: the profile's)")
    p.add_argument("--own_pretrain", type=parse_bool, default=None, help="use outputs/pretrain/<recipe> when no hub: true|false (default true)")
    p.add_argument("--learning_rate", type=float, default=None, help="peak learning rate (default: the profile's)")
    p.add_argument("--max_len", type=int, default=None, help="tokens per window (default: the profile's)")
    p.add_argument("--dropout", type=float, default=None,
                   help="dropout of the encoder (hidden + attention) and the heads (default: the profile's, else the checkpoint's own)")
    p.add_argument("--unanswerable_share", type=float, default=None, help="share of unanswerable questions in the training sample (default: as drawn)")
    p.add_argument("--repeat", nargs="*", default=None, metavar="SOURCE=TIMES",
                   help="repeat a source's questions in each fold's training set, e.g. checklist_demo=10")
    p.add_argument("--train_sources", default=None, metavar="A,B,...",
                   help="comma-separated training sets (names as `bash run.sh data` prints them; default: the profile's, "
                        "else configs/default.yaml)")
    p.add_argument("--swap_negatives", type=float, default=None,
                   help="add unanswerable copies of this share of a fold's answerable training questions, one key word "
                        "swapped for a look-alike (mrc.augment; default: the profile's, else 0)")
    p.add_argument("--negative_windows", type=float, default=None,
                   help="share of answer-less training windows of answerable questions kept (default: the profile's, else 1)")
    p.add_argument("--max_minutes", type=float, default=None, help="wall-clock budget for the whole run (folds share it)")
    p.add_argument("--max_questions", type=int, default=None, help="cap on training questions (default: the profile's)")
    p.add_argument("--epochs", type=float, default=None, help="epochs per fold (default: the profile's)")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--data_dir", default=None, help="data root (default: $MRC_DATA_DIR or ../shared/data)")
    p.add_argument("--config", default="configs/train.yaml", help="training config file")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: configs/default.yaml seed)")
    add_precision_flags(p)
    return p


def parse_repeats(items) -> dict:
    from mrc.data import SOURCES

    out = {}
    for item in items:
        source, _, times = item.partition("=")
        if source not in SOURCES or not times.isdigit() or int(times) < 1:
            raise MRCError(f"--repeat {item}: expected SOURCE=TIMES with a known source and TIMES >= 1")
        out[source] = int(times)
    return out


def resolve_config(args) -> dict:
    cfg = load_yaml_config("configs/default.yaml", args.config)
    profiles = cfg.pop("profiles", {})
    if args.profile not in profiles:
        raise MRCError(f"{args.config}: no profile '{args.profile}' (has {', '.join(profiles)})")
    profile = dict(profiles[args.profile])
    cfg["post"] = {**(cfg.get("post") or {}), **(profile.pop("post", None) or {})}  # a profile changes single post keys
    cfg.update(profile)
    overrides = {"model": args.model, "folds": args.folds, "train_folds": args.train_folds, "use_title": args.use_title, "match_types": args.match_types, "offline_size": args.offline_size,
                 "own_pretrain": args.own_pretrain, "learning_rate": args.learning_rate, "max_len": args.max_len, "dropout": args.dropout, "unanswerable_share": args.unanswerable_share,
                 "negative_windows": args.negative_windows, "swap_negatives": args.swap_negatives, "max_questions": args.max_questions,
                 "epochs": args.epochs, "output_dir": args.output_dir, "data_dir": args.data_dir, "seed": args.seed,
                 "max_minutes": args.max_minutes}
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    if args.train_sources is not None:
        cfg["train_sources"] = [name.strip() for name in args.train_sources.split(",") if name.strip()]
    from mrc.data import check_train_sources

    check_train_sources(cfg["train_sources"])
    if cfg.get("dev_source") in cfg["train_sources"]:
        raise MRCError(f"train_sources: {cfg['dev_source']} is the development set and never training data")
    if args.repeat is not None:
        cfg["repeat_sources"] = parse_repeats(args.repeat)
    folds_to_train = int(cfg.get("train_folds") or cfg["folds"])
    if cfg.get("min_fold_minutes") and args.train_folds is None and cfg.get("max_minutes"):
        # no more folds than the budget trains fully: at 15 minutes two folds of 6 answered nothing on dev_public
        folds_to_train = cfg["train_folds"] = max(1, min(folds_to_train, int(cfg["max_minutes"] // cfg["min_fold_minutes"])))
    sized_for = cfg.get("epochs_sized_for_minutes")
    fold_minutes = cfg["max_minutes"] / folds_to_train if cfg.get("max_minutes") else None
    if args.epochs is None and sized_for and fold_minutes and fold_minutes > sized_for:
        # the profile's epochs fill `sized_for` minutes of one fold (the folds share the budget equally); a longer
        # budget trains proportionally longer (the learning-rate schedule ends with the budget instead of idling)
        cfg["epochs"] = round(float(cfg["epochs"]) * fold_minutes / sized_for, 2)
    if cfg.get("dropout") is not None and not 0 <= float(cfg["dropout"]) < 1:
        raise MRCError(f"--dropout {cfg['dropout']}: must be in [0, 1)")
    if cfg.get("target_unanswerable_share") is not None:  # checked here, not after the training it would end
        from mrc.postprocess import label_shift_weights

        label_shift_weights([True, False], cfg["target_unanswerable_share"])
    if cfg.get("unanswerable_share") is not None and not 0 <= float(cfg["unanswerable_share"]) <= 1:
        raise MRCError(f"--unanswerable_share {cfg['unanswerable_share']}: must be between 0 and 1")
    from mrc.postprocess import check_expand_to

    check_expand_to(cfg["post"].get("expand_to"), f"{args.config}: post")  # before training, not at prediction
    if not 0 <= float(cfg.get("swap_negatives") or 0) <= 1:
        raise MRCError(f"--swap_negatives {cfg['swap_negatives']}: must be between 0 and 1")
    if cfg.get("train_folds") and not 1 <= int(cfg["train_folds"]) <= int(cfg["folds"]):
        raise MRCError(f"--train_folds {cfg['train_folds']}: must be between 1 and the number of folds ({cfg['folds']})")
    cfg["profile"] = args.profile
    cfg["precision"] = precision_kwargs(args)
    cfg["exp"] = args.exp or f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(str(cfg['model'])).name)}_{args.profile}"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", cfg["exp"]):
        raise MRCError(f"--exp {cfg['exp']!r}: use letters, digits, '_', '-', '.' only")
    out = Path(cfg["output_dir"])
    cfg["output_dir"] = str(out if out.is_absolute() else REPO_ROOT / out)
    return cfg


def main(argv=None):
    args = build_parser().parse_args(argv)
    cfg = resolve_config(args)
    t_start = time.time()
    deadline = t_start + 60 * cfg["max_minutes"] if cfg.get("max_minutes") else None

    from mrc import backbone, data, metric, postprocess
    from mrc.distributed import barrier, is_main_process, main_process_first
    from mrc.features import build_features
    from mrc.folds import load_or_make_folds
    from mrc.io_utils import set_all_seeds, write_run_info
    from mrc.sampling import cap, select_questions
    from mrc.vocab import fast_tokenizer

    seed = int(cfg["seed"])
    set_all_seeds(seed)
    out_root = Path(cfg["output_dir"])
    exp_dir = out_root / cfg["exp"]
    spec = backbone.resolve_backbone(cfg["model"], cfg["profile"], outputs_dir=out_root, size=cfg.get("offline_size"),
                                     own_pretrain=bool(cfg.get("own_pretrain", True)))
    log.info(spec.describe())
    data_dir = data.resolve_data_dir(cfg.get("data_dir"))
    train_df = select_questions(data.load_sources(cfg["train_sources"], data_dir), cfg.get("max_questions"), seed,
                                cfg.get("unanswerable_share"))
    dev_df = cap(data.labelled(data.load_sources([cfg["dev_source"]], data_dir)), cfg.get("dev_max_questions"), seed)
    log.info("training questions: %d (%d unanswerable) from %s; dev (%s): %d", len(train_df), int(train_df["is_impossible"].sum()),
             dict(train_df["source"].value_counts()), cfg["dev_source"], len(dev_df))
    with main_process_first():  # rank 0 writes the folds file and (when needed) the project vocab; the others read them
        folds = load_or_make_folds(train_df, out_root / cfg["folds_file"], int(cfg["folds"]), seed)
        _, tokenizer = load_encoder(spec, data_dir)
    fast = fast_tokenizer(tokenizer)
    feat_args = dict(max_len=int(cfg["max_len"]), stride=int(cfg["stride"]), use_title=bool(cfg["use_title"]),
                     match_types=bool(cfg.get("match_types", False)))
    dev_features = build_features(dev_df, fast, **feat_args)
    info = {"model": cfg["model"], "backbone": {"kind": spec.kind, "arch": spec.arch, "source": spec.source, "reason": spec.reason},
            "features": {**feat_args, "feature_key": dev_features.key}, "post": cfg["post"], "folds": int(cfg["folds"]),
            "trained_folds": list(range(int(cfg.get("train_folds") or cfg["folds"]))),
            "profile": cfg["profile"], "train_questions": len(train_df), "dev_questions": len(dev_df)}
    old_info = exp_dir / "train_info.json"
    if old_info.exists():
        old = json.loads(old_info.read_text(encoding="utf-8"))
        if (old.get("features") != info["features"] or old.get("folds") != info["folds"]
                or old.get("trained_folds", info["trained_folds"]) != info["trained_folds"]) or old.get("backbone", {}).get("arch") != spec.arch:
            raise MRCError(f"{old_info}: outputs/{cfg['exp']} was made with other settings ({old.get('features')}, "
                           f"{old.get('folds')} folds); use another --exp or delete the directory")
    if is_main_process():
        atomic_write_json(old_info, info)
        tokenizer.save_pretrained(str(exp_dir / "tokenizer"))
        write_run_info(exp_dir, cfg, seed)

    gold_train, gold_dev = metric.gold_from_examples(train_df), metric.gold_from_examples(dev_df)
    fold_ids = info["trained_folds"]
    fold_metrics = []
    for i, k in enumerate(fold_ids):
        remaining = None if deadline is None else (deadline - time.time()) / (len(fold_ids) - i)
        fold_metrics.append(run_fold(k, cfg, spec, data_dir, train_df[folds != k].reset_index(drop=True),
                                     train_df[folds == k].reset_index(drop=True), dev_df, dev_features,
                                     fast, feat_args, exp_dir / f"fold{k}", remaining, seed))
    barrier()
    if not is_main_process():
        return 0  # rank 0 alone does the overall out-of-fold threshold and CV

    # overall: threshold on every out-of-fold prediction, dev from the mean of the fold models' logits
    from mrc.finetune import score_examples, target_answers

    oof_scores = {}
    for k in fold_ids:
        oof_scores.update(score_examples(postprocess.load_logits(exp_dir / f"fold{k}" / "oof.npz"), train_df, cfg["post"]))
    gold_train = {i: gold_train[i] for i in oof_scores}  # only the trained folds' questions have out-of-fold scores
    stacker = None
    if "stack" in cfg["threshold_modes"]:
        from mrc import answerability

        oof_df = train_df[train_df["id"].astype(str).isin(set(oof_scores))]
        stacker = answerability.fit_stacker(oof_scores, answerability.hand_feature_table(oof_df), gold_train, seed)
        if stacker is not None:
            log.info("stacked no-answer decision: fitted on %d out-of-fold questions; largest weights %s",
                     stacker["questions"], answerability.describe(stacker))
    modes = [m for m in cfg["threshold_modes"] if m != "stack" or stacker is not None]
    tuned = postprocess.tune_threshold(oof_scores, gold_train, modes, target_unanswerable_share=cfg.get("target_unanswerable_share"))
    threshold = {"mode": tuned["mode"], "threshold": tuned["threshold"], "tuned_on": "out-of-fold", "oof_F1": tuned["F1"],
                 "oof_EM": tuned["EM"], "questions": tuned["total"], "feature_key": dev_features.key, "stacker": stacker,
                 "target_unanswerable_share": cfg.get("target_unanswerable_share")}
    atomic_write_json(exp_dir / "threshold.json", threshold)
    dev_logits = postprocess.average_logits([postprocess.load_logits(exp_dir / f"fold{k}" / "dev.npz") for k in fold_ids])
    dev_scores = score_examples(dev_logits, dev_df, cfg["post"])
    if stacker is not None:
        answerability.apply_stacker(dev_scores, answerability.hand_feature_table(dev_df), stacker)
    dev_scores = target_answers(dev_scores, dev_df, cfg["post"])
    dev_pred = postprocess.decide(dev_scores, tuned["threshold"], tuned["mode"])
    atomic_write_json(exp_dir / "dev_predictions.json", dev_pred)
    no_answer = lambda gold: metric.evaluate(gold, {i: metric.NO_ANSWER for i in gold})  # noqa: E731
    oof_pred = postprocess.decide(oof_scores, tuned["threshold"], tuned["mode"])
    cv = {"cv": _short(metric.evaluate(gold_train, oof_pred)), "cv_all_no_answer": _short(no_answer(gold_train)),
          "dev": _short(metric.evaluate(gold_dev, dev_pred)), "dev_all_no_answer": _short(no_answer(gold_dev)),
          "cv_diagnostics": postprocess.diagnostics(oof_scores, gold_train), "dev_diagnostics": postprocess.diagnostics(dev_scores, gold_dev),
          "threshold": threshold, "folds": fold_metrics, "backbone": spec.describe(),
          "wall_seconds": round(time.time() - t_start, 1)}
    atomic_write_json(exp_dir / "cv.json", cv)
    write_run_info(exp_dir, cfg, seed, metrics=cv)
    log.info("CV F1 %.3f EM %.3f (all 'no answer': %.3f) | dev F1 %.3f EM %.3f (all 'no answer': %.3f) | %s",
             cv["cv"]["F1"], cv["cv"]["EM"], cv["cv_all_no_answer"]["F1"], cv["dev"]["F1"], cv["dev"]["EM"],
             cv["dev_all_no_answer"]["F1"], exp_dir)
    log.info("diagnostics: CV %s | dev %s", cv["cv_diagnostics"], cv["dev_diagnostics"])
    print(json.dumps({k: cv[k] for k in ("cv", "cv_all_no_answer", "dev", "dev_all_no_answer", "cv_diagnostics", "dev_diagnostics")}, ensure_ascii=False))
    return 0


def _short(result: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}


def model_modes(cfg) -> list[str]:
    """The configured no-answer modes a single fold can tune (the stacker is fitted on all folds at the end)."""
    from mrc.postprocess import MODEL_MODES

    return [m for m in cfg["threshold_modes"] if m in MODEL_MODES] or list(MODEL_MODES)


def aligned_logging_steps(logging_steps: int, eval_steps: int) -> int:
    """The largest divisor of eval_steps not above logging_steps: every checkpoint then falls on a logging
    step, so a resumed run logs the same losses as an uninterrupted one."""
    return max(d for d in range(1, max(1, min(logging_steps, eval_steps)) + 1) if eval_steps % d == 0)


def logged_loss_mean(log_history) -> float | None:
    """Mean training loss over the logged steps (from the Trainer's log history, which a resume restores;
    the Trainer's own training_loss only counts the steps since the resume)."""
    previous, total, steps = 0, 0.0, 0
    for entry in log_history:
        if "loss" in entry:
            n = entry["step"] - previous
            total, steps, previous = total + entry["loss"] * n, steps + n, entry["step"]
    return total / steps if steps else None


def load_encoder(spec, data_dir, dropout=None):
    """backbone.load_encoder (also builds the project vocab when needed); an unreadable checkpoint is one
    line naming it, not a traceback."""
    from mrc import backbone

    try:
        return backbone.load_encoder(spec, data_dir=data_dir, dropout=dropout)
    except MRCError:
        raise
    except Exception as err:
        raise MRCError(f"{spec.source}: cannot load the {spec.arch} checkpoint ({first_line(err)})") from None


def run_fold(k, cfg, spec, data_dir, fit_df, valid_df, dev_df, dev_features, fast, feat_args, fold_dir, budget_seconds, seed):
    """Train fold k (or skip it when finished) and write its model, oof.npz, dev.npz, metrics.json."""
    done = fold_dir / "metrics.json"
    if done.exists():
        log.info("fold %d: finished before (%s), skipping", k, done)
        return json.loads(done.read_text(encoding="utf-8"))
    from paddlenlp.trainer import TrainingArguments

    from mrc import metric, postprocess
    from mrc.distributed import barrier, is_main_process
    from mrc.features import build_features
    from mrc.callbacks import TimeBudget, last_complete_checkpoint
    from mrc.finetune import (FeatureDataset, InferenceReserve, LengthBucketBatchSampler, MRCTrainer, SamplerEpoch, collate,
                              predict_logits, save_state_atomic, score_examples, target_answers)
    from mrc.io_utils import set_all_seeds
    from mrc.features import NUM_MATCH_TYPES
    from mrc.model import SpanAnswerableModel, count_parameters, extend_token_types
    from mrc.fast_encoder import speed_up_for_cpu

    t0 = time.time()
    set_all_seeds(seed + k)
    fold_dir.mkdir(parents=True, exist_ok=True)
    from mrc.sampling import keep_negative_windows, repeat_sources

    from mrc.augment import SWAP_SUFFIX, swap_negatives

    if cfg.get("swap_negatives"):  # before the repeats: one copy per question, unique ids
        import pandas as pd

        fit_df = pd.concat([fit_df, swap_negatives(fit_df, float(cfg["swap_negatives"]), random.Random(seed + k))], ignore_index=True)
    fit_df = repeat_sources(fit_df, cfg.get("repeat_sources") or {})
    train_features = keep_negative_windows(build_features(fit_df, fast, **feat_args), float(cfg.get("negative_windows", 1.0)), seed + k)
    valid_features = build_features(valid_df, fast, **feat_args)
    eval_df = valid_df
    if cfg.get("eval_max_questions") and len(valid_df) > cfg["eval_max_questions"]:
        eval_df = valid_df.sample(n=int(cfg["eval_max_questions"]), random_state=seed).reset_index(drop=True)
    eval_features = build_features(eval_df, fast, **feat_args)
    log.info("fold %d: %d training questions -> %d windows; %d held-out -> %d windows (%d for checkpoint selection)",
             k, len(fit_df), len(train_features), len(valid_df), len(valid_features), len(eval_features))

    encoder, _ = load_encoder(spec, data_dir, dropout=cfg.get("dropout"))
    if feat_args["match_types"] and extend_token_types(encoder, NUM_MATCH_TYPES):
        log.info("fold %d: token-type embedding extended to %d rows for the match types", k, NUM_MATCH_TYPES)
    head_dropout = cfg["train"]["dropout"] if cfg.get("dropout") is None else float(cfg["dropout"])
    model = SpanAnswerableModel(encoder, dropout=head_dropout)
    log.info("fold %d: model %s, %d parameters", k, type(encoder).__name__, count_parameters(model))
    if cfg.get("cpu_fast_paths", True):
        speed_up_for_cpu(model)
    sampler = LengthBucketBatchSampler(train_features.lengths(), int(cfg["batch_size"]), seed=seed + k)
    steps_per_epoch = len(sampler)
    targs = TrainingArguments(
        output_dir=str(fold_dir), per_device_train_batch_size=int(cfg["batch_size"]),
        per_device_eval_batch_size=int(cfg["eval_batch_size"]), learning_rate=float(cfg["learning_rate"]),
        num_train_epochs=float(cfg["epochs"]), warmup_ratio=cfg["train"]["warmup_ratio"], weight_decay=cfg["train"]["weight_decay"],
        logging_steps=aligned_logging_steps(int(cfg["train"]["logging_steps"]), int(cfg["eval_steps"])), evaluation_strategy="steps", eval_steps=int(cfg["eval_steps"]),
        save_strategy="steps", save_steps=int(cfg["eval_steps"]), save_total_limit=2, load_best_model_at_end=True,
        metric_for_best_model="select", greater_is_better=True, seed=seed + k, report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, device="cpu", skip_memory_metrics=True, **cfg.get("precision", {}),
    )
    # the fold's share of --max_minutes also pays for the out-of-fold and dev passes after training
    reserve = InferenceReserve(len(valid_features) + len(dev_features))
    reserve.calibrate(model, eval_features, int(cfg["eval_batch_size"]))
    budget = TimeBudget(None if budget_seconds is None else t0 + budget_seconds, eval_at_end=True, reserve=reserve)
    if budget_seconds is not None:
        log.info("fold %d: %.1f min budget, training stops by about %s", k, budget_seconds / 60,
                 time.strftime("%H:%M:%S", time.localtime(budget.deadline)))
    trainer = MRCTrainer(model=model, args=targs, train_dataset=FeatureDataset(train_features),
                         eval_dataset=FeatureDataset(eval_features), data_collator=collate,
                         callbacks=[SamplerEpoch(sampler), budget], train_sampler=sampler,
                         eval_features=eval_features, eval_df=eval_df, post_cfg=cfg["post"], modes=model_modes(cfg))
    reserve.trainer = trainer
    last = last_complete_checkpoint(fold_dir, remove_incomplete=is_main_process())
    if last:
        log.info("fold %d: resuming from %s (step %s)", k, last, last.rsplit("-", 1)[-1])
    trainer.train(resume_from_checkpoint=last)
    model_dir = fold_dir / "model"
    if is_main_process():
        model_dir.mkdir(exist_ok=True)
        encoder.config.save_pretrained(str(model_dir))
        save_state_atomic(model, str(model_dir / "model_state.pdparams"))

    oof_logits, _ = predict_logits(model, valid_features, int(cfg["eval_batch_size"]), desc=f"fold {k} out-of-fold")
    dev_logits, _ = predict_logits(model, dev_features, int(cfg["eval_batch_size"]), desc=f"fold {k} dev")
    if is_main_process():
        postprocess.save_logits(fold_dir / "oof.npz", oof_logits)
        postprocess.save_logits(fold_dir / "dev.npz", dev_logits)

    oof_scores = score_examples(oof_logits, valid_df, cfg["post"])
    tuned = postprocess.tune_threshold(oof_scores, metric.gold_from_examples(valid_df), model_modes(cfg),
                                       target_unanswerable_share=cfg.get("target_unanswerable_share"))
    dev_pred = postprocess.decide(target_answers(score_examples(dev_logits, dev_df, cfg["post"]), dev_df, cfg["post"]), tuned["threshold"], tuned["mode"])
    dev_result = metric.evaluate(metric.gold_from_examples(dev_df), dev_pred)
    log_history = [h for h in trainer.state.log_history if "loss" in h]
    fold_metrics = {
        "fold": k, "train_questions": len(fit_df), "swap_negatives": int(fit_df["id"].astype(str).str.endswith(SWAP_SUFFIX).sum()),
        "train_windows": len(train_features), "valid_questions": len(valid_df),
        "steps": trainer.state.global_step, "steps_per_epoch": steps_per_epoch, "stopped_by_time_budget": budget.stopped_early,
        "best_checkpoint": str(trainer.state.best_model_checkpoint), "best_select": trainer.state.best_metric,
        "train_loss_first": log_history[0]["loss"] if log_history else None,
        "train_loss_last": log_history[-1]["loss"] if log_history else None, "train_loss_mean": logged_loss_mean(trainer.state.log_history),
        "oof": {"F1": tuned["F1"], "EM": tuned["EM"], "mode": tuned["mode"], "threshold": tuned["threshold"], "answered": tuned["answered"]},
        "dev": {"F1": dev_result["F1"], "EM": dev_result["EM"]}, "seconds": round(time.time() - t0, 1),
        "eval_history": [h for h in trainer.state.log_history if "eval_f1" in h],
    }
    barrier()  # every rank is done with the fold's checkpoints before rank 0 marks it finished and removes them
    if is_main_process():
        atomic_write_json(fold_dir / "metrics.json", fold_metrics)  # written last: marks the fold finished
        for ckpt in fold_dir.glob("checkpoint-*"):
            shutil.rmtree(ckpt, ignore_errors=True)
    log.info("fold %d: OOF F1 %.3f EM %.3f (%s >= %.4g), dev F1 %.3f, %.0f s", k, tuned["F1"], tuned["EM"], tuned["mode"],
             tuned["threshold"], dev_result["F1"], time.time() - t0)
    return fold_metrics


if __name__ == "__main__":
    runtime.run_main(main)
