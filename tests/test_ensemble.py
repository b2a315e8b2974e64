"""Ensemble: fusion of logits (same and different tokenizers), OOF-only tuning, alignment, submissions.

Synthetic logits in the npz contract (mrc.postprocess.make_logits): passages tokenized one character
per token ("char" tokenizer) or two characters per token ("pair" tokenizer), several windows per
passage. No model is run; the CLI is exercised on a tiny data dir and fake experiment dirs.
"""
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import yaml

from mrc import ensemble, metric, postprocess
from mrc.errors import MRCError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
POST = {"n_best": 20, "max_answer_tokens": 64, "max_answer_chars": None}
HANZI = "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏闰余成岁律吕调阳云腾致雨露结为霜金生丽水玉出昆冈"


def char_tokens(ctx):
    return [(i, i + 1) for i in range(len(ctx))]


def pair_tokens(ctx):
    return [(i, min(i + 2, len(ctx))) for i in range(0, len(ctx), 2)]


def windows_of(n_tokens, size, step):
    starts = list(range(0, max(1, n_tokens - size + step), step)) if n_tokens > size else [0]
    return [(s, min(s + size, n_tokens)) for s in starts]


def build_logits(examples, tokenize, key, start_fn, end_fn, answerable_fn, window=8, step=5, width=12):
    """examples: [(id, context)]; start_fn(id, token_span) -> logit, likewise end; answerable_fn(id) -> p."""
    ids, starts, ends, offsets, ans = [], [], [], [], []
    for eid, ctx in examples:
        toks = tokenize(ctx)
        for a, b in windows_of(len(toks), window, step):
            spans = toks[a:b]
            off = np.full((width, 2), -1, dtype=np.int32)
            off[1: 1 + len(spans)] = spans
            s = np.full(width, postprocess.PAD_LOGIT, dtype=np.float32)
            e = np.full(width, postprocess.PAD_LOGIT, dtype=np.float32)
            s[0] = e[0] = 0.0
            for t, span in enumerate(spans, start=1):
                s[t], e[t] = start_fn(eid, span), end_fn(eid, span)
            p = float(np.clip(answerable_fn(eid), 1e-4, 1 - 1e-4))
            ids.append(eid)
            starts.append(s)
            ends.append(e)
            offsets.append(off)
            ans.append([0.0, np.log(p / (1 - p))])
    return postprocess.make_logits(ids, np.stack(starts), np.stack(ends), np.stack(offsets), np.array(ans), key)


def peaks(table):
    """start/end functions from {id: {char_start: logit}} (others 0)."""
    return lambda eid, span: table.get(eid, {}).get(span[0], 0.0)


def peaks_end(table):
    return lambda eid, span: table.get(eid, {}).get(span[1], 0.0)


# ---------------------------------------------------------------- unit tests of the fusions
def test_same_tokenizer_weighted_average_equals_manual_average():
    rng = np.random.default_rng(0)
    examples = [("q1", HANZI[:14]), ("q2", HANZI[5:20])]
    members = [build_logits(examples, char_tokens, "k", lambda i, s: rng.normal(), lambda i, s: rng.normal(),
                            lambda i: rng.uniform()) for _ in range(3)]
    w = [0.2, 0.3, 0.5]
    fused = ensemble.weighted_logits(members, w)
    for key in ("start_logits", "end_logits", "answerable_logits", "p_answerable"):
        manual = sum(wi * m[key].astype(np.float64) for wi, m in zip(w, members))
        np.testing.assert_allclose(fused[key], manual, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(fused["offsets"], members[0]["offsets"])
    contexts = dict(examples)
    # the fused scores are exactly example_scores of the manual average: one post-processing
    manual = dict(members[0], start_logits=sum(wi * m["start_logits"] for wi, m in zip(w, members)),
                  end_logits=sum(wi * m["end_logits"] for wi, m in zip(w, members)),
                  p_answerable=sum(wi * m["p_answerable"] for wi, m in zip(w, members)))
    fused_scores = ensemble.fuse_scores(members, w, contexts, POST, "logits")
    manual_scores = postprocess.example_scores(manual, contexts)
    assert fused_scores.keys() == manual_scores.keys()
    for eid, rec in manual_scores.items():
        assert fused_scores[eid]["text"] == rec["text"] and fused_scores[eid]["start"] == rec["start"]
        for field in ("score", "null_score", "p_answerable"):
            assert fused_scores[eid][field] == pytest.approx(rec[field], rel=1e-5, abs=1e-5)
    # equal weights by default; weights are normalised
    np.testing.assert_allclose(ensemble.weighted_logits(members[:2], [2, 2])["start_logits"],
                               (members[0]["start_logits"] + members[1]["start_logits"]) / 2, rtol=1e-6)


def test_logits_fusion_refuses_different_feature_keys():
    ex = [("q1", HANZI[:10])]
    a = build_logits(ex, char_tokens, "A", peaks({}), peaks_end({}), lambda i: 0.5)
    b = build_logits(ex, pair_tokens, "B", peaks({}), peaks_end({}), lambda i: 0.5)
    with pytest.raises(MRCError, match="same tokenizer"):
        ensemble.fuse_scores([a, b], None, dict(ex), POST, "logits")
    with pytest.raises(MRCError, match="feature_key"):
        ensemble.weighted_logits([a, b])
    assert ensemble.resolve_fusion("auto", [a, b]) == "char"
    assert ensemble.resolve_fusion("auto", [a, a]) == "logits"


# passage of 16 characters; the right answer is characters 6..10 (aligned for both tokenizers).
# Member A (one char per token) slightly prefers the wrong span 12..14; member B (two chars per
# token) clearly prefers the right one. Alone A is wrong, fused they are right.
CTX = HANZI[:16]
RIGHT, WRONG = (6, 10), (12, 14)


def two_tokenizer_members():
    ex = [("q", CTX)]
    a = build_logits(ex, char_tokens, "A", peaks({"q": {RIGHT[0]: 4.0, WRONG[0]: 4.5}}),
                     peaks_end({"q": {RIGHT[1]: 4.0, WRONG[1]: 4.5}}), lambda i: 0.8)
    b = build_logits(ex, pair_tokens, "B", peaks({"q": {RIGHT[0]: 6.0, WRONG[0]: 1.0}}),
                     peaks_end({"q": {RIGHT[1]: 6.0, WRONG[1]: 1.0}}), lambda i: 0.6, window=5, step=3)
    assert len(a["example_id"]) > 1 and len(b["example_id"]) > 1  # several windows each
    return a, b, {"q": CTX}


@pytest.mark.parametrize("fusion", ["char", "nbest"])
def test_different_tokenizers_fused_pick_the_right_span(fusion):
    a, b, contexts = two_tokenizer_members()
    alone = ensemble.fuse_scores([a, b], [1, 0], contexts, POST, fusion)["q"]
    assert alone["text"] == CTX[WRONG[0]:WRONG[1]]  # member A alone is wrong
    fused = ensemble.fuse_scores([a, b], [0.5, 0.5], contexts, POST, fusion)["q"]
    assert fused["text"] == CTX[RIGHT[0]:RIGHT[1]] and fused["start"] == RIGHT[0]
    assert fused["p_answerable"] == pytest.approx(0.7, abs=1e-4)  # weighted mean of 0.8 and 0.6
    # the record feeds THE decision unchanged
    assert postprocess.decide({"q": fused}, 0.5, "prob") == {"q": CTX[RIGHT[0]:RIGHT[1]]}
    assert postprocess.decide({"q": fused}, 0.9, "prob") == {"q": "no answer"}
    assert np.isfinite(postprocess.decision_value(fused, "null"))


def test_char_fusion_maps_token_scores_onto_characters():
    a, b, contexts = two_tokenizer_members()
    b_probs = ensemble.char_probs(b, contexts)
    probs = b_probs["q"]
    # B's tokens are character pairs: start mass only on even characters, end mass only on odd ones
    assert probs[0][1::2].max() == 0 and probs[1][0::2].max() == 0
    assert int(np.argmax(probs[0])) == RIGHT[0] and int(np.argmax(probs[1])) == RIGHT[1] - 1
    fused = ensemble.char_logits([ensemble.char_probs(a, contexts), b_probs], [0.5, 0.5])
    assert fused["start_logits"].shape == (1, 1 + len(CTX))
    np.testing.assert_array_equal(fused["offsets"][0, 1:], [[i, i + 1] for i in range(len(CTX))])


def test_nbest_sums_probabilities_of_the_same_string():
    # A spreads its mass over two spans with the same text "XY" (at 0 and 4), each below "Z"'s
    ctx = "XYabXYcdZZ"
    ex = [("q", ctx)]
    a = build_logits(ex, char_tokens, "A", peaks({"q": {0: 3.0, 4: 3.0, 8: 3.25}}), peaks_end({"q": {2: 3.0, 6: 3.0, 10: 3.25}}),
                     lambda i: 0.9, window=16, width=16)
    strings = ensemble.nbest_strings(a, {"q": ctx})["q"]
    assert postprocess.example_scores(a, {"q": ctx})["q"]["text"] == "ZZ"  # the best single span
    assert strings["probs"]["XY"] > strings["probs"]["ZZ"]
    fused = ensemble.fuse_scores([a], None, {"q": ctx}, POST, "nbest")["q"]
    assert fused["text"] == "XY" and fused["start"] == 0
    assert fused["score"] == pytest.approx(np.log(strings["probs"]["XY"]))
    assert fused["null_score"] == pytest.approx(np.log(strings["null"]))


def test_weight_grid_and_normalisation():
    grid = ensemble.weight_grid(3, 0.25)
    assert grid[0] == pytest.approx((1 / 3,) * 3) and len(grid) == 1 + 15
    assert all(abs(sum(g) - 1) < 1e-9 for g in grid)
    with pytest.raises(MRCError, match="2 weights for 3 members"):
        ensemble.normalize_weights([1, 2], 3, ["a", "b", "c"])
    with pytest.raises(MRCError, match="non-negative"):
        ensemble.normalize_weights([1, -1], 2)


def test_misaligned_members_refused():
    ids = [np.array(["a", "a", "b"]), np.array(["c", "d"])]
    ensemble.check_aligned(["x", "y"], [ids, [np.array(["b", "a"]), np.array(["d", "c"])]])  # order within a fold is free
    with pytest.raises(MRCError, match="fold assignment differs"):
        ensemble.check_aligned(["x", "y"], [ids, [np.array(["a", "c"]), np.array(["b", "d"])]])
    with pytest.raises(MRCError, match="out-of-fold ids differ"):
        ensemble.check_aligned(["x", "y"], [ids, [np.array(["a", "b"]), np.array(["c", "e"])]])
    with pytest.raises(MRCError, match="3 folds"):
        ensemble.check_aligned(["x", "y"], [ids, ids + [np.array(["e"])]])


# ---------------------------------------------------------------- the CLI on fake experiments
N_OOF, N_DEV = 24, 10


def make_questions(n, seed, prefix):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ctx = "".join(rng.choice(HANZI) for _ in range(rng.randrange(14, 22)))
        answerable = i % 3 != 0
        s = rng.randrange(0, len(ctx) - 6, 2)
        out.append({"id": f"{prefix}{i}", "context": ctx, "span": (s, s + 4) if answerable else None,
                    "type": "in-domain" if i % 2 else "vocab_noun"})
    return out


def squad_file(questions):
    paras = [{"context": q["context"], "qas": [{
        "id": q["id"], "question": "问题" + q["id"], "type": q["type"], "is_impossible": q["span"] is None,
        "answers": [] if q["span"] is None else [{"text": q["context"][q["span"][0]:q["span"][1]], "answer_start": q["span"][0]}],
    }]} for q in questions]
    return {"data": [{"title": "标题", "paragraphs": paras}]}


def member_logits(questions, id_prefix, tokenize, key, strength, seed):
    """Logits that point at the gold span with `strength`, plus seeded noise."""
    rng = np.random.default_rng(seed)
    spans = {id_prefix + q["id"]: q["span"] for q in questions}
    noise = {}

    def start(eid, span):
        gold = spans[eid]
        return (strength if gold and span[0] == gold[0] else 0.0) + noise.setdefault((eid, "s", span), rng.normal())

    def end(eid, span):
        gold = spans[eid]
        return (strength if gold and span[1] == gold[1] else 0.0) + noise.setdefault((eid, "e", span), rng.normal())

    def answerable(eid):
        return 1 / (1 + np.exp(-(strength * (1 if spans[eid] else -1) / 3 + 2 * rng.normal())))

    return build_logits([(id_prefix + q["id"], q["context"]) for q in questions], tokenize, key, start, end, answerable,
                        window=10, step=6, width=12)


@pytest.fixture
def workspace(tmp_path):
    """data dir (checklist demo = training questions, dev_public = the test input) + two experiments
    with different tokenizers (A: characters, B: character pairs) sharing 2 folds."""
    data = tmp_path / "data"
    (data / "mrc" / "dureader_checklist").mkdir(parents=True)
    train = make_questions(N_OOF, 1, "t")
    dev = make_questions(N_DEV, 2, "d")
    (data / "mrc" / "dureader_checklist" / "demo.json").write_text(json.dumps(squad_file(train), ensure_ascii=False), encoding="utf-8")
    dev_path = data / "mrc" / "dureader_checklist" / "dev_public.json"
    dev_path.write_text(json.dumps(squad_file(dev), ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "outputs"
    for exp, tok, strength in (("expA", char_tokens, 3.0), ("expB", pair_tokens, 2.0)):
        write_experiment(out / exp, train, dev, tok, exp[-1], strength, folds=lambda i: i % 2)
    return {"data": data, "out": out, "dev": dev_path, "subs": tmp_path / "subs", "train": train, "dev_q": dev}


def write_experiment(exp_dir, train, dev, tok, key, strength, folds, dev_seed=0):
    for k in range(2):
        fold_dir = exp_dir / f"fold{k}"
        fold_dir.mkdir(parents=True, exist_ok=True)
        held = [q for i, q in enumerate(train) if folds(i) == k]
        postprocess.save_logits(fold_dir / "oof.npz", member_logits(held, "checklist_demo:", tok, key, strength, 10 + k))
        postprocess.save_logits(fold_dir / "dev.npz", member_logits(dev, "checklist_dev:", tok, key, strength, 20 + k + dev_seed))
    (exp_dir / "train_info.json").write_text(json.dumps({
        "features": {"max_len": 16, "stride": 4, "use_title": False, "feature_key": key}, "post": POST, "folds": 2,
        "backbone": {"kind": "random", "arch": "bert"}}))
    (exp_dir / "threshold.json").write_text(json.dumps({"mode": "prob", "threshold": 0.5}))
    (exp_dir / "cv.json").write_text(json.dumps({"cv": {"F1": 50.0, "EM": 40.0}, "dev": {"F1": 55.0, "EM": 45.0}}))
    (exp_dir / "config.yaml").write_text(yaml.safe_dump({"dev_source": "checklist_dev", "threshold_modes": ["prob", "null"]}))


def run_cli(ws, *extra, name="sub"):
    import ensemble as cli

    cli.main(["--exps", "expA", "expB", "--input", str(ws["dev"]), "--name", name, "--output_dir", str(ws["out"]),
              "--data_dir", str(ws["data"]), "--submissions_dir", str(ws["subs"]), *extra])
    result = json.loads((ws["out"] / "ensemble" / name / "result.json").read_text())
    return result, json.loads((ws["subs"] / f"{name}.json").read_text())


@pytest.mark.parametrize("fusion", ["auto", "nbest"])
def test_cli_writes_complete_submission_tuned_on_oof(workspace, fusion):
    ws = workspace
    result, sub = run_cli(ws, "--fusion", fusion)
    assert result["fusion"] == ("char" if fusion == "auto" else "nbest")
    assert set(sub) == {q["id"] for q in ws["dev_q"]}  # every input id, original ids
    assert all(isinstance(v, str) and v for v in sub.values())
    assert len(result["weight_grid"]) == 5 and result["weights_tuned"]  # 2 members, step 0.25
    assert result["cv"]["TOTAL"] == N_OOF and result["test"]["TOTAL"] == N_DEV
    # the reported CV is the best of the (cached) weight search, recomputed without the cache
    assert result["cv"]["F1"] == pytest.approx(max(f1 for _, f1 in result["weight_grid"]), abs=1e-3)
    assert result["cv"]["F1"] > result["cv_all_no_answer"]["F1"]  # the synthetic logits carry signal
    # the scores in result.json are the official metric of the submission written
    gold = metric.load_gold(ws["dev"])
    assert result["test"]["F1"] == pytest.approx(metric.evaluate(gold, sub)["F1"], abs=1e-3)
    md = (ws["subs"] / "sub.md").read_text()
    assert "expA" in md and "expB" in md and "out-of-fold" in md and "bash run.sh ensemble" in md


def test_cli_tuning_ignores_the_test_input(workspace):
    ws = workspace
    first, sub1 = run_cli(ws, name="one")
    # other test logits and other gold on the test side: weights and threshold must not move
    for exp, tok, key, strength in (("expA", char_tokens, "A", 3.0), ("expB", pair_tokens, "B", 2.0)):
        write_experiment(ws["out"] / exp, ws["train"], ws["dev_q"], tok, key, strength, folds=lambda i: i % 2, dev_seed=7)
    dev = ws["dev_q"]
    for q in dev:
        q["span"] = None
    ws["dev"].write_text(json.dumps(squad_file(dev), ensure_ascii=False), encoding="utf-8")
    second, sub2 = run_cli(ws, name="two")
    assert second["weights"] == first["weights"] and second["threshold"] == first["threshold"]
    assert second["cv"] == first["cv"]
    assert second["test"] != first["test"]  # the test side did change


def test_cli_given_weights_are_used(workspace):
    result, _ = run_cli(workspace, "--weights", "3", "1", name="given")
    assert result["weights"] == pytest.approx([0.75, 0.25]) and not result["weights_tuned"]
    assert len(result["weight_grid"]) == 1


def test_cli_zero_weight_member_is_not_run(workspace):
    ws = workspace
    (ws["out"] / "expB" / "fold1" / "dev.npz").unlink()  # expB could not answer the input now
    result, sub = run_cli(ws, "--weights", "1", "0", name="zero")
    assert result["test_logits"] == {"expA": "dev.npz of the folds", "expB": "not needed (weight 0)"}
    assert set(sub) == {q["id"] for q in ws["dev_q"]}


def test_cli_refuses_misaligned_members_in_one_line(workspace):
    ws = workspace
    write_experiment(ws["out"] / "expC", ws["train"], ws["dev_q"], char_tokens, "A", 3.0, folds=lambda i: int(i < N_OOF // 2))
    proc = subprocess.run([sys.executable, str(ROOT / "src" / "ensemble.py"), "--exps", "expA", "expC", "--input", str(ws["dev"]),
                           "--name", "bad", "--output_dir", str(ws["out"]), "--data_dir", str(ws["data"]),
                           "--submissions_dir", str(ws["subs"])], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: expC: fold assignment differs from expA")
    assert len([l for l in proc.stderr.splitlines() if l.startswith("error")]) == 1 and "Traceback" not in proc.stderr
    assert not (ws["subs"] / "bad.json").exists()


def test_cli_writes_nothing_when_an_input_id_cannot_be_answered(workspace):
    ws = workspace
    dev = ws["dev_q"] + make_questions(1, 3, "extra")  # an id the dev.npz files do not have, and no fold models
    ws["dev"].write_text(json.dumps(squad_file(dev), ensure_ascii=False), encoding="utf-8")
    with pytest.raises(MRCError, match="fold model missing"):
        run_cli(ws, name="partial")
    assert not (ws["subs"] / "partial.json").exists()


def test_cli_unfinished_experiment_is_one_clear_error(workspace):
    (workspace["out"] / "expB" / "cv.json").unlink()
    with pytest.raises(MRCError, match="expB: no cv.json; finish training first"):
        run_cli(workspace, name="x")


def test_cli_stacked_decision_is_fitted_on_oof_and_applied_to_the_input(workspace):
    ws = workspace
    for exp in ("expA", "expB"):
        (ws["out"] / exp / "config.yaml").write_text(yaml.safe_dump({"dev_source": "checklist_dev",
                                                                     "threshold_modes": ["prob", "null", "stack"]}))
    result, sub = run_cli(ws, name="stacked")
    stacker = result["threshold"]["stacker"]
    assert stacker is not None and stacker["questions"] == N_OOF and len(stacker["coef"]) == len(stacker["features"])
    assert set(sub) == {q["id"] for q in ws["dev_q"]}
    gold = metric.load_gold(ws["dev"])
    assert result["test"]["F1"] == pytest.approx(metric.evaluate(gold, sub)["F1"], abs=1e-3)
    assert result["cv"]["F1"] >= result["cv_all_no_answer"]["F1"]
