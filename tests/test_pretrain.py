"""End to end: `bash run.sh pretrain --profile tiny` for every recipe, outputs loadable for fine-tuning,
resume from the last checkpoint, the wall-clock budget, and no evaluation text in the pre-training data."""
import json
import logging

import numpy as np
import pytest

import pretrain
from mrc.pretrain_data import TokenStore, eval_sentences, split_sentences

ARCH = {"bert": "bert", "roberta": "bert", "ernie": "ernie", "albert": "albert"}
PREFIX = {"bert": "bert", "ernie": "ernie", "albert": "transformer"}


def run(out, *flags, recipe="bert"):
    assert pretrain.main(["--recipe", recipe, "--profile", "tiny", "--output", str(out), *flags]) == 0
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    """Each recipe's tiny run, made once for the module."""
    cache = {}

    def get(recipe):
        if recipe not in cache:
            out = tmp_path_factory.mktemp(f"pretrain_{recipe}")
            cache[recipe] = (out, run(out, recipe=recipe))
        return cache[recipe]

    return get


@pytest.mark.parametrize("recipe", ["bert", "roberta", "ernie", "albert"])
def test_tiny_pretrain_each_recipe_loads_for_fine_tuning(runs, recipe):
    import paddle
    from paddlenlp.transformers import AlbertModel, AutoTokenizer, BertModel, ErnieModel

    out, metrics = runs(recipe)
    assert metrics["global_step"] == 6
    assert 0.0 <= metrics["heldout_mlm_acc"] <= 1.0 and 0.0 < metrics["heldout_mlm_baseline_acc"] < 1.0
    assert abs(metrics["heldout_masked_fraction"] - 0.15) < 0.03
    pair_task = {"bert": "nsp", "roberta": None, "ernie": "nsp", "albert": "sop"}[recipe]
    if pair_task:
        assert 0.0 <= metrics[f"heldout_{pair_task}_acc"] <= 1.0
    else:
        assert not any(k.startswith("heldout_nsp") or k.startswith("heldout_sop") for k in metrics)
    config = (out / "config.yaml").read_text(encoding="utf-8")
    assert f"recipe: {recipe}" in config and "seed: 42" in config

    model_class = {"bert": BertModel, "ernie": ErnieModel, "albert": AlbertModel}[ARCH[recipe]]
    encoder = model_class.from_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert len(tokenizer) == encoder.config.vocab_size
    # the encoder holds the trained weights, not a fresh init
    state = paddle.load(str(out / "model_state.pdparams"))
    key = f"{PREFIX[ARCH[recipe]]}.embeddings.word_embeddings.weight"
    assert np.allclose(encoder.embeddings.word_embeddings.weight.numpy(), state[key].numpy())
    encoded = tokenizer("北京大学的张三教授", "在上海参加了会议。", return_token_type_ids=True)
    encoder.eval()
    hidden = encoder(paddle.to_tensor([encoded["input_ids"]]),
                     token_type_ids=paddle.to_tensor([encoded["token_type_ids"]]))[0]
    assert hidden.shape == [1, len(encoded["input_ids"]), encoder.config.hidden_size]


def test_no_eval_passage_sentence_in_pretraining_data(runs, data_dir):
    """Every sentence of dev_public's passages, tokenised like the store, is absent from the stored documents."""
    from mrc.vocab import fast_tokenizer, load_tokenizer

    out, metrics = runs("bert")
    fast = fast_tokenizer(load_tokenizer(str(out)))
    dev = {tuple(e.ids) for e in fast.encode_batch(sorted(eval_sentences(["checklist_dev"], data_dir)),
                                                   add_special_tokens=False)}
    stored = set()
    for split in ("train", "heldout"):
        store = TokenStore(out / "data" / f"{split}_tokens")
        offsets = np.asarray(store.sent_offsets)
        ids = np.asarray(store.ids)
        stored |= {tuple(ids[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])}
    assert len(stored) > 500 and not (dev & stored)
    # the check can fail: a passage made of dev sentences would be caught
    leaked = split_sentences("".join(sorted(eval_sentences(["checklist_dev"], data_dir))[:3]))
    assert {tuple(e.ids) for e in fast.encode_batch(leaked, add_special_tokens=False)} & dev


def test_resume_continues_the_step_count(data_dir, tmp_path, caplog):
    out = tmp_path / "resume"
    first = run(out, "--max_steps", "3")
    assert first["global_step"] == 3 and (out / "checkpoints" / "checkpoint-3").is_dir()
    manifest_mtime = (out / "data" / "manifest.json").stat().st_mtime
    with caplog.at_level(logging.INFO, logger="mrc.pretrain"):
        second = run(out, "--max_steps", "6")
    assert any("resuming from" in r.getMessage() and "checkpoint-3" in r.getMessage() for r in caplog.records)
    assert second["global_step"] == 6
    assert (out / "data" / "manifest.json").stat().st_mtime == manifest_mtime  # the instances were reused
    state = json.loads((out / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text(encoding="utf-8"))
    logged_steps = [h["step"] for h in state["log_history"] if "loss" in h]
    assert logged_steps == [2, 4, 6]  # steps 1-3 from the first run, 4-6 after resuming: nothing trained twice
    # rerunning a finished run trains nothing more
    assert run(out, "--max_steps", "6")["global_step"] == 6


def test_time_budget_stops_with_a_checkpoint_and_a_rerun_resumes(data_dir, tmp_path):
    out = tmp_path / "budget"
    stopped = run(out, "--max_minutes", "0.001", recipe="albert")
    assert stopped["global_step"] == 1 and (out / "checkpoints" / "checkpoint-1").is_dir()
    assert (out / "model_state.pdparams").is_file() and "heldout_sop_acc" in stopped
    assert run(out, recipe="albert")["global_step"] == 6


def test_epoch_callback_drives_dynamic_masking():
    from types import SimpleNamespace

    from mrc.masking import MaskingConfig
    from mrc.pretrain_data import PretrainingCollator

    ids = {"mask": 4, "pad": 0, "cls": 2, "sep": 3, "special": [0, 1, 2, 3, 4]}
    collator = PretrainingCollator(ids, 50, MaskingConfig(), seed=0, dynamic=True)
    example = {"index": 0, "input_ids": np.array([2] + list(range(5, 45)) + [3]), "unit_start": np.ones(42, np.uint8)}
    epoch_callback = pretrain.make_trainer_classes()[1](collator)
    masks = []
    for epoch in (0.0, 1.0, 1.5, 2.0):  # 1.5: a run resumed in the middle of its second epoch
        epoch_callback.on_epoch_begin(None, SimpleNamespace(epoch=epoch), None)
        masks.append(collator.mask(example)[1].tolist())
    assert collator.epoch == 2 and masks[1] == masks[2] and masks[0] != masks[1] != masks[3]


def test_bad_flags_exit_2(capsys):
    with pytest.raises(SystemExit) as err:
        pretrain.parse_args(["--recipe", "gpt"])
    assert err.value.code == 2


def test_recipe_settings_per_profile_override_the_profile_and_flags_override_both():
    def lr(*flags):
        cfg = pretrain.resolve_config(pretrain.parse_args(list(flags)))
        return cfg["learning_rate"], cfg["warmup_ratio"]

    assert lr("--recipe", "albert", "--profile", "cpu") == (5.0e-4, 0.1)  # configs/pretrain.yaml recipes.albert.profiles.cpu
    assert lr("--recipe", "bert", "--profile", "cpu") == (1.0e-3, 0.05)  # the profile's own
    assert lr("--recipe", "albert", "--profile", "tiny") == (1.0e-3, 0.0)
    assert lr("--recipe", "albert", "--profile", "cpu", "--learning_rate", "1e-4", "--warmup_ratio", "0") == (1e-4, 0.0)


def test_albert_mlm_decoder_shares_the_word_embeddings(tmp_path):
    """ALBERT ties its MLM decoder to the input embeddings; paddlenlp 2.8.1 ties only in from_pretrained, so a
    random-init or loaded model was untied. One gradient step moves the shared matrix for both; a model loaded
    for --init is tied too."""
    import paddle
    from paddlenlp.transformers import AlbertForPretraining

    from mrc.pretrain_model import new_pretraining_model, tie_output_embeddings

    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    model = new_pretraining_model("albert", sizes, vocab_size=50, pad_token_id=0)
    embeddings = model.transformer.embeddings.word_embeddings.weight
    assert model.predictions.decoder.weight is embeddings
    before = embeddings.numpy().copy()
    logits = model.predictions(paddle.randn([3, 32]))
    paddle.nn.functional.cross_entropy(logits, paddle.to_tensor([[1], [2], [3]])).backward()
    paddle.optimizer.SGD(learning_rate=1.0, parameters=model.parameters()).step()
    assert not np.allclose(before, model.transformer.embeddings.word_embeddings.weight.numpy())
    model.save_pretrained(str(tmp_path))
    loaded = tie_output_embeddings(AlbertForPretraining.from_pretrained(str(tmp_path)), "albert")  # as --init does
    assert loaded.predictions.decoder.weight is loaded.transformer.embeddings.word_embeddings.weight
    assert np.allclose(loaded.predictions.decoder.weight.numpy(), model.predictions.decoder.weight.numpy())
