"""Continued MLM pre-training with the BERT family's recipes (bash run.sh pretrain).

    bash run.sh pretrain [--recipe bert|roberta|ernie|albert] [--init NAME_OR_DIR] [--profile tiny|cpu|full]
                         [--output DIR] [--max_minutes N]

Steps: tokenizer (the --init checkpoint's, else the project vocab) -> text (THUCNews + training passages,
never evaluation passages) -> token store + instances on disk (cached by a config fingerprint) -> paddlenlp
Trainer (resumes from the last checkpoint in <output>/checkpoints) -> the final *ForPretraining model and
tokenizer in <output>, loadable with <Arch>Model.from_pretrained / AutoTokenizer.from_pretrained, plus
config.yaml and metrics.json (held-out MLM and NSP/SOP accuracy, most-frequent-token baseline, wall time).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: E402,F401  (threads/MKL env before paddle)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from mrc.errors import MRCError, first_line  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, load_yaml_config, write_run_info  # noqa: E402
from mrc.masking import MaskingConfig  # noqa: E402
from mrc.pretrain_data import (  # noqa: E402
    DATA_VERSION, PretrainingCollator, PretrainingDataset, TokenStore, build_instances, build_token_store, eval_sentences,
    fingerprint, iter_documents, tokenizer_ids, train_passages,
)

log = logging.getLogger("mrc.pretrain")
RECIPES = ("bert", "roberta", "ernie", "albert")
PROFILES = ("tiny", "cpu", "full")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bash run.sh pretrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", choices=RECIPES, default="bert", help="pre-training recipe (configs/pretrain.yaml)")
    p.add_argument("--init", default=None,
                   help="hub name or checkpoint dir to continue from (its tokenizer is used unchanged); "
                        "default: the profile's offline small model with the project vocab ('full': the recipe's hub model)")
    p.add_argument("--profile", choices=PROFILES, default="cpu", help="tiny (tests), cpu (offline default), full (GPU)")
    p.add_argument("--output", default=None, help="output dir (default: outputs/pretrain/<recipe>)")
    p.add_argument("--max_minutes", type=float, default=None, help="wall-clock budget of the whole stage")
    p.add_argument("--max_steps", type=int, default=None, help="override the profile's number of optimizer steps")
    p.add_argument("--learning_rate", type=float, default=None, help="override the profile's (and recipe's) peak learning rate")
    p.add_argument("--warmup_ratio", type=float, default=None, help="override the fraction of steps spent warming up")
    p.add_argument("--seed", type=int, default=None, help="default: configs/default.yaml seed")
    p.add_argument("--data_dir", default=None, help="data dir (default: $MRC_DATA_DIR, ../shared/data, data/)")
    p.add_argument("--corpus_lines", type=int, default=None, help="use only the first N corpus articles")
    p.add_argument("--max_passages", type=int, default=None, help="use only the first N training passages")
    p.add_argument("--overwrite_output", action="store_true", help="start over instead of resuming")
    return p.parse_args(argv)


def resolve_config(args) -> dict:
    base = load_yaml_config("configs/default.yaml", "configs/pretrain.yaml")
    profile = dict(base["profiles"][args.profile])
    recipe = dict(base["recipes"][args.recipe])
    # a recipe's own settings per profile (e.g. ALBERT's learning rate), then the command line
    profile.update((recipe.pop("profiles", None) or {}).get(args.profile) or {})
    for key in ("max_minutes", "max_steps", "corpus_lines", "max_passages", "learning_rate", "warmup_ratio"):
        if getattr(args, key) is not None:
            profile[key] = getattr(args, key)
    if recipe["dynamic_masking"]:
        profile["dupe_factor"] = 1  # a new mask each epoch replaces the static copies
    outputs_root = Path(base["output_dir"])
    if not outputs_root.is_absolute():
        outputs_root = REPO_ROOT / outputs_root
    output = Path(args.output).resolve() if args.output else outputs_root / "pretrain" / args.recipe
    # the development set's passages stay out of pre-training whatever the text config says
    eval_sources = sorted(set(base["text"]["eval_sources"]) | {base["dev_source"]})
    return {
        "recipe": args.recipe, **recipe, "profile": args.profile, **profile,
        "init": args.init, "output": str(output), "outputs_root": str(outputs_root),
        "seed": args.seed if args.seed is not None else base["seed"],
        "data_dir": args.data_dir or base.get("data_dir"),
        "train_sources": list(base["train_sources"]), "eval_sources": eval_sources,
        "masking_probs": dict(base["masking"]), "cpu_fast_paths": bool(base.get("cpu_fast_paths", True)),
    }


# ----------------------------------------------------------------------------------------------- text

class Text:
    """The pre-training documents, re-iterable (each pass streams the corpus file again)."""

    def __init__(self, cfg, corpus_lines, max_passages):
        from mrc.data import corpus_path

        self.corpus = corpus_path(cfg["data_dir"])
        self.corpus_lines = corpus_lines
        self.exclude = eval_sentences(cfg["eval_sources"], cfg["data_dir"])
        self.passages = train_passages(cfg["train_sources"], cfg["data_dir"], max_passages)
        self.stats: dict = {}

    def documents(self):
        self.stats = {}
        return iter_documents(self.corpus, self.passages, self.corpus_lines, self.exclude, self.stats)


def resolve_tokenizer(cfg):
    """(paddlenlp tokenizer, description, init source or None). --init decides; else the project vocab."""
    from mrc.backbone import hub_reachable, arch_of_dir
    from mrc.vocab import build_vocab, ensure_project_vocab, load_tokenizer

    init = cfg["init"]
    if init is None and cfg["profile"] == "full":
        init = load_yaml_config(f"configs/models/{cfg['model']}.yaml")["hub"]
    if init is not None:
        if Path(init).is_dir():
            if arch_of_dir(init) != cfg["arch"]:
                raise MRCError(f"{init}: holds a {arch_of_dir(init)} model but recipe {cfg['recipe']} "
                               f"trains {cfg['arch']}")
            return load_tokenizer(init), f"tokenizer of local checkpoint {init}", init
        if str(init).startswith((".", "/", "~")):
            raise MRCError(f"{init}: checkpoint directory not found")
        reachable, why = hub_reachable(init)
        if reachable:
            return load_tokenizer(init), f"tokenizer of hub model {init}", init
        log.warning("--init %s: %s: offline pre-training from scratch with the project vocab", init, why)
    if cfg["model_size"] is None:
        raise MRCError(f"profile {cfg['profile']}: needs a reachable checkpoint (--init hub name or dir); "
                       f"offline use --profile cpu")
    if cfg["shared_vocab"]:
        vocab_dir = ensure_project_vocab(Path(cfg["outputs_root"]) / "vocab", cfg["data_dir"])
    else:  # tiny: a vocab of the tiny text itself, inside the output dir
        vocab_dir = Path(cfg["output"]) / "vocab"
        if not (vocab_dir / "vocab.txt").is_file():
            text = Text(cfg, cfg["corpus_lines"], cfg["max_passages"])
            build_vocab(("".join(doc) for doc in text.documents()), vocab_dir)
    return load_tokenizer(str(vocab_dir)), f"project vocab {vocab_dir}", None


# ----------------------------------------------------------------------------------------------- data

def prepare_data(cfg, tokenizer, fast_tok) -> dict:
    """Token stores and instances for train / held-out documents under <output>/data (reused if unchanged)."""
    from mrc.distributed import is_main_process

    data_dir = Path(cfg["output"]) / "data"
    vocab_hash = fingerprint(sorted(tokenizer.get_vocab().items()))
    key = {k: cfg[k] for k in ("masking", "pair_task", "dupe_factor", "max_seq_len", "short_seq_prob", "corpus_lines",
                               "max_passages", "heldout_fraction", "seed", "eval_sources", "train_sources")}
    key["vocab"] = vocab_hash
    key["version"] = DATA_VERSION
    if cfg["masking"] == "ernie":  # only ERNIE's units changed (jieba HMM off): other recipes keep their data
        from mrc.masking import ERNIE_UNITS

        key["ernie_units"] = ERNIE_UNITS
    manifest_path = data_dir / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("fingerprint") == fingerprint(key):
            log.info("reusing pre-training data in %s", data_dir)
            return manifest
        log.info("pre-training data in %s is from another configuration: rebuilding", data_dir)
    if not is_main_process():  # rank 0 built it first (main_process_first): a mismatch here is a bug
        raise MRCError(f"{manifest_path}: rank 0 did not leave this configuration's pre-training data")
    if manifest_path.is_file():
        manifest_path.unlink()  # a rebuild killed half-way must not look complete
    text = Text(cfg, cfg["corpus_lines"], cfg["max_passages"])
    seed, frac = cfg["seed"], cfg["heldout_fraction"]

    def heldout(k):
        return random.Random(f"{seed}:heldout:{k}").random() < frac

    stores = {}
    for split, keep in (("train", lambda k: not heldout(k)), ("heldout", heldout)):
        docs = (doc for k, doc in enumerate(text.documents()) if keep(k))
        stores[split] = build_token_store(docs, fast_tok, cfg["masking"], data_dir / f"{split}_tokens")
    ids = tokenizer_ids(tokenizer)
    counts = {}
    for split, rng_seed in (("train", seed), ("heldout", seed + 1)):
        store = TokenStore(stores[split])
        if len(store) < 2:
            raise MRCError(f"{text.corpus}: too little text for pre-training ({len(store)} {split} documents)")
        build_instances(store, data_dir / f"{split}_instances", ids["cls"], ids["sep"], cfg["max_seq_len"],
                        cfg["short_seq_prob"], cfg["pair_task"], cfg["dupe_factor"], random.Random(rng_seed))
        counts[split] = {"documents": len(store), "tokens": int(store.meta["tokens"]),
                         "instances": len(PretrainingDataset(data_dir / f"{split}_instances"))}
    manifest = {"fingerprint": fingerprint(key), "key": key, "text": text.stats, "counts": counts,
                "most_frequent_token": most_frequent_token(TokenStore(stores["train"]), ids["special"])}
    atomic_write_json(manifest_path, manifest)
    return manifest


def most_frequent_token(store: TokenStore, special_ids) -> int:
    """The commonest non-special token of the training text (the MLM baseline always predicts it)."""
    counts = np.zeros(int(store.ids.max()) + 1 if len(store.ids) else 1, dtype=np.int64)
    for start in range(0, len(store.ids), 1 << 20):  # chunked: memory does not grow with the corpus
        chunk = np.asarray(store.ids[start:start + (1 << 20)])
        counts[: chunk.max() + 1] += np.bincount(chunk, minlength=chunk.max() + 1)
    counts[[s for s in special_ids if s < len(counts)]] = 0
    return int(counts.argmax())


# ---------------------------------------------------------------------------------------------- model

def build_model(cfg, tokenizer, init):
    from mrc.pretrain_model import new_pretraining_model, pretraining_classes, tie_output_embeddings

    classes = pretraining_classes(cfg["arch"])
    if init is not None:
        try:
            model = tie_output_embeddings(classes.pretraining.from_pretrained(init), cfg["arch"])
        except Exception as err:  # an unreadable checkpoint is one line naming it, not a traceback
            raise MRCError(f"{init}: cannot load the {cfg['arch']} checkpoint ({first_line(err)})") from None
        log.info("weights: %s.from_pretrained(%s) (a head missing from the checkpoint starts random)",
                 classes.pretraining.__name__, init)
        return model, f"{classes.pretraining.__name__} from {init}"
    sizes = load_yaml_config("configs/models/offline_sizes.yaml")[cfg["model_size"]]
    model = new_pretraining_model(cfg["arch"], sizes, len(tokenizer), tokenizer.pad_token_id)
    desc = f"{classes.pretraining.__name__} random init (offline config {cfg['model_size']}: {sizes})"
    log.info("weights: %s", desc)
    return model, desc


# -------------------------------------------------------------------------------------------- trainer

def make_trainer_classes():
    import paddle
    import paddle.nn.functional as F
    from paddlenlp.trainer import Trainer, TrainerCallback

    from mrc.callbacks import CompleteCheckpoints, TimeBudget, check_finite_loss
    from mrc.pretrain_model import pretraining_logits

    class PretrainTrainer(CompleteCheckpoints, Trainer):
        """MLM (+ NSP/SOP) loss on masked positions only; evaluation = held-out accuracies. A NaN/inf loss
        stops the run naming the step and batch; checkpoints count once marked complete."""

        def setup_pretraining(self, cfg, eval_collator, baseline_token):
            self.cfg, self.eval_collator, self.baseline_token = cfg, eval_collator, baseline_token

        def compute_loss(self, model, inputs, return_outputs=False):
            mlm_logits, pair_logits = pretraining_logits(model, self.cfg["arch"], inputs)
            loss = F.cross_entropy(mlm_logits, inputs["masked_lm_labels"].reshape([-1, 1]))
            if self.cfg["pair_task"] != "none":
                loss = loss + F.cross_entropy(pair_logits, inputs["next_sentence_labels"].reshape([-1, 1]))
            if not math.isfinite(float(loss)):  # the batch is described only when it is needed
                check_finite_loss(loss, self.state.global_step + 1, self._batch_desc(inputs))
            return (loss, (mlm_logits, pair_logits)) if return_outputs else loss

        def _batch_desc(self, inputs) -> str:
            """'<k> of epoch <e> (<n> instances, <m> masked tokens)' for the NaN guard's message."""
            state = self.state
            per_epoch = len(self.get_train_dataloader()) if self.train_dataset is not None else 0
            where = (f"{state.global_step % per_epoch + 1} of epoch {math.floor(state.epoch or 0) + 1}" if per_epoch
                     else str(state.global_step + 1))
            return (f"{where} ({int(inputs['input_ids'].shape[0])} instances, "
                    f"{int(inputs['masked_lm_labels'].shape[0])} masked tokens)")

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", max_batches=None):
            dataset = eval_dataset or self.eval_dataset
            loader = paddle.io.DataLoader(dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False,
                                          collate_fn=self.eval_collator, return_list=True)
            max_batches = max_batches or self.cfg["eval_batches"]
            model = self.model
            was_training = model.training
            model.eval()
            n_masked = n_correct = n_baseline = n_pairs = n_pair_correct = n_tokens = 0
            mlm_loss = pair_loss = 0.0
            with paddle.no_grad():
                for b, batch in enumerate(loader):
                    if b >= max_batches:
                        break
                    mlm_logits, pair_logits = pretraining_logits(model, self.cfg["arch"], batch)
                    labels = batch["masked_lm_labels"].numpy()
                    pred = mlm_logits.argmax(-1).numpy()
                    n_masked += len(labels)
                    n_correct += int((pred == labels).sum())
                    n_baseline += int((labels == self.baseline_token).sum())
                    n_tokens += int(batch["attention_mask"].numpy().sum())
                    mlm_loss += float(F.cross_entropy(mlm_logits, batch["masked_lm_labels"].reshape([-1, 1]),
                                                      reduction="sum"))
                    pair_labels = batch["next_sentence_labels"]
                    n_pairs += len(pair_labels)
                    n_pair_correct += int((pair_logits.argmax(-1).numpy() == pair_labels.numpy()).sum())
                    pair_loss += float(F.cross_entropy(pair_logits, pair_labels.reshape([-1, 1]), reduction="sum"))
            if was_training:
                model.train()
            metrics = {
                "mlm_acc": n_correct / max(n_masked, 1),
                "mlm_loss": mlm_loss / max(n_masked, 1),
                "mlm_baseline_acc": n_baseline / max(n_masked, 1),
                "masked_fraction": n_masked / max(n_tokens, 1),
                "masked_tokens": n_masked,
                "instances": n_pairs,
            }
            if self.cfg["pair_task"] != "none":
                metrics[f"{self.cfg['pair_task']}_acc"] = n_pair_correct / max(n_pairs, 1)
                metrics[f"{self.cfg['pair_task']}_loss"] = pair_loss / max(n_pairs, 1)
            metrics = {f"{metric_key_prefix}_{k}": v for k, v in metrics.items()}
            self.log(dict(metrics))  # log() adds the epoch to the dict it is given
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    class EpochForMasking(TrainerCallback):
        """Tell the collator the epoch, so dynamic masking draws a new mask each epoch (also after resume)."""

        def __init__(self, collator):
            self.collator = collator

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.collator.epoch = int(math.floor((state.epoch or 0.0) + 1e-6))

    return PretrainTrainer, EpochForMasking, TimeBudget


def main(argv=None):
    args = parse_args(argv)
    import paddle

    # Fresh parameter names for every run, so a checkpoint's optimizer state matches its parameters even
    # when main() runs twice in one process (tests); a new process gets the same names anyway.
    with paddle.utils.unique_name.guard():
        return pretrain(args)


def pretrain(args):
    start = time.time()
    cfg = resolve_config(args)
    out = Path(cfg["output"])
    ckpt_dir = out / "checkpoints"
    budget_s = cfg["max_minutes"] * 60 if cfg.get("max_minutes") else None

    from paddlenlp.trainer import TrainingArguments

    from mrc.callbacks import last_complete_checkpoint
    from mrc.distributed import is_main_process, main_process_first
    from mrc.io_utils import set_all_seeds
    from mrc.vocab import fast_tokenizer

    set_all_seeds(cfg["seed"])
    # Data-parallel: rank 0 clears, builds the vocab and the instances first; the others then find them on disk.
    with main_process_first():
        if is_main_process():
            out.mkdir(parents=True, exist_ok=True)
            if args.overwrite_output:
                shutil.rmtree(ckpt_dir, ignore_errors=True)
        tokenizer, tok_desc, init = resolve_tokenizer(cfg)
        log.info("recipe %s (profile %s): %s", cfg["recipe"], cfg["profile"], tok_desc)
    model, model_desc = build_model(cfg, tokenizer, init)  # before the data: a bad --init fails in seconds
    if cfg["cpu_fast_paths"]:
        from mrc.fast_encoder import speed_up_for_cpu

        speed_up_for_cpu(model)
    with main_process_first():
        manifest = prepare_data(cfg, tokenizer, fast_tokenizer(tokenizer))
    data_dir = out / "data"
    train_ds = PretrainingDataset(data_dir / "train_instances")
    heldout_ds = PretrainingDataset(data_dir / "heldout_instances")
    log.info("instances: %d train, %d held-out (%s)", len(train_ds), len(heldout_ds), manifest["counts"])

    masking = MaskingConfig(masked_lm_prob=cfg["masking_probs"]["masked_lm_prob"],
                            max_predictions_per_seq=cfg["max_predictions_per_seq"],
                            mask_token_prob=cfg["masking_probs"]["mask_token_prob"],
                            random_token_prob=cfg["masking_probs"]["random_token_prob"])
    ids = tokenizer_ids(tokenizer)
    train_collator = PretrainingCollator(ids, len(tokenizer), masking, cfg["seed"], cfg["dynamic_masking"])
    eval_collator = PretrainingCollator(ids, len(tokenizer), masking, cfg["seed"] + 1, dynamic=False)

    PretrainTrainer, EpochForMasking, TimeBudget = make_trainer_classes()
    # Leave room in the budget for the final evaluation and save.
    deadline = start + budget_s - min(60.0, 0.1 * budget_s) if budget_s else None
    training_args = TrainingArguments(
        output_dir=str(ckpt_dir), per_device_train_batch_size=cfg["batch_size"],
        per_device_eval_batch_size=cfg["batch_size"], learning_rate=cfg["learning_rate"],
        warmup_ratio=cfg["warmup_ratio"], weight_decay=0.01, max_grad_norm=1.0, max_steps=cfg["max_steps"],
        logging_steps=cfg["logging_steps"], evaluation_strategy="steps", eval_steps=cfg["eval_steps"],
        save_steps=cfg["save_steps"], save_total_limit=2, seed=cfg["seed"], dataloader_num_workers=0,
        do_train=True, do_eval=True, report_to=[], disable_tqdm=False,
    )
    trainer = PretrainTrainer(model=model, args=training_args, data_collator=train_collator, train_dataset=train_ds,
                              eval_dataset=heldout_ds, tokenizer=tokenizer,
                              callbacks=[EpochForMasking(train_collator), TimeBudget(deadline)])
    trainer.setup_pretraining(cfg, eval_collator, manifest["most_frequent_token"])
    last = last_complete_checkpoint(ckpt_dir, remove_incomplete=is_main_process()) if ckpt_dir.is_dir() else None
    done_steps = 0
    if last:
        done_steps = json.loads((Path(last) / "trainer_state.json").read_text(encoding="utf-8"))["global_step"]
        log.info("resuming from %s (step %d of %d)", last, done_steps, cfg["max_steps"])
    if done_steps < cfg["max_steps"]:
        trainer.train(resume_from_checkpoint=last)
    else:
        log.info("already trained for %d steps: evaluating and saving only", done_steps)
        trainer._load_from_checkpoint(last)
        trainer.state.global_step = done_steps
    trainer.save_model(str(out))  # *ForPretraining weights + config + tokenizer files: <Arch>Model.from_pretrained(out)
    final = trainer.evaluate(metric_key_prefix="heldout", max_batches=cfg["eval_batches"])
    metrics = {
        **{k: round(v, 6) if isinstance(v, float) else v for k, v in final.items()},
        "most_frequent_token": tokenizer.convert_ids_to_tokens(manifest["most_frequent_token"]),
        "global_step": int(trainer.state.global_step),
        "wall_time_s": round(time.time() - start, 1),
        "data": manifest["counts"], "text": manifest["text"],
        "weights": model_desc, "tokenizer": tok_desc,
    }
    if is_main_process():
        write_run_info(out, cfg, cfg["seed"], metrics)
    pair = f", {cfg['pair_task']} acc {metrics.get('heldout_' + cfg['pair_task'] + '_acc'):.3f}" if cfg["pair_task"] != "none" else ""
    log.info("done: step %d, held-out MLM acc %.3f (most-frequent-token baseline %.3f)%s, %.0f s -> %s",
             metrics["global_step"], metrics["heldout_mlm_acc"], metrics["heldout_mlm_baseline_acc"], pair,
             metrics["wall_time_s"], out)
    return 0


if __name__ == "__main__":
    runtime.run_main(main)
