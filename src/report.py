"""Backbone comparison: one table and one chart of every experiment and ensemble, CV and dev_public.

    bash run.sh report [--exps bert ernie] [--ensembles ens3]

Rows: each experiment's out-of-fold CV and dev_public scores (outputs/<exp>/cv.json), each ensemble's
(outputs/ensemble/<name>/result.json, made by bash run.sh ensemble), and answering 'no answer'
everywhere. Columns: the leaderboard's (F1, EM, in-domain F1, checklist F1, the five category F1s),
all by the official metric (mrc.metric). Writes outputs/report/report.md, report.csv and report.png
(F1 and EM overall, in-domain and per category on dev_public; CV F1/EM).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402

import argparse  # noqa: E402
import logging  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_text, load_yaml_config, read_json  # noqa: E402

log = logging.getLogger("mrc.report")

CATEGORIES = ("vocab", "phrase", "semantic-role", "fault-tolerant", "reasoning")
# (column, key in mrc.metric.evaluate's result)
METRIC_COLUMNS = [("F1", "F1"), ("EM", "EM"), ("in-domain F1", "F1_in-domain"), ("checklist F1", "checklist_F1")] + [
    (f"{c} F1", f"F1_{c}") for c in CATEGORIES]
COLUMNS = ["name", "kind", "split", "questions"] + [c for c, _ in METRIC_COLUMNS]
NO_ANSWER_ROW = "no answer everywhere"


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh report", description=__doc__.split("\n\n")[0])
    p.add_argument("--exps", nargs="*", default=None, help="experiments (default: every outputs/<exp>/cv.json)")
    p.add_argument("--ensembles", nargs="*", default=None, help="ensembles (default: every outputs/ensemble/<name>/result.json)")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--out", default=None, help="report dir (default: <outputs root>/report)")
    p.add_argument("--data_dir", default=None, help="data root, for the dev_public 'no answer' row (default: the usual)")
    return p


def _abs(path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def row(name, kind, split, result: dict | None) -> dict:
    result = result or {}
    out = {"name": name, "kind": kind, "split": split, "questions": result.get("TOTAL"), "_raw": result}
    for column, key in METRIC_COLUMNS:
        value = result.get(key)
        out[column] = round(float(value), 3) if value is not None else None
    return out


def collect_rows(out_root: Path, exps=None, ensembles=None, data_dir=None) -> list[dict]:
    """Rows of the table: the 'no answer' baselines, then experiments, then ensembles."""
    from mrc import data, metric

    if exps is None:
        exps = sorted(p.parent.name for p in out_root.glob("*/cv.json"))
    if ensembles is None:
        ensembles = sorted(p.parent.name for p in (out_root / "ensemble").glob("*/result.json"))
    if not exps and not ensembles:
        raise MRCError(f"{out_root}: no finished experiment (*/cv.json) or ensemble (ensemble/*/result.json) to report")
    baselines, rows = [], []
    for exp in exps:
        path = out_root / exp / "cv.json"
        if not path.is_file():
            raise MRCError(f"{path}: not found; finish training first (bash run.sh train --exp {exp})")
        cv = read_json(path)
        rows.append(row(exp, "experiment", "CV", cv.get("cv")))
        rows.append(row(exp, "experiment", "dev_public", cv.get("dev")))
        baselines.append(row(NO_ANSWER_ROW, "baseline", "CV", cv.get("cv_all_no_answer")))
        baselines.append(row(NO_ANSWER_ROW, "baseline", "dev_public", cv.get("dev_all_no_answer")))
    for name in ensembles:
        path = out_root / "ensemble" / name / "result.json"
        if not path.is_file():
            raise MRCError(f"{path}: not found; run bash run.sh ensemble --name {name} first")
        res = read_json(path)
        rows.append(row(name, "ensemble", "CV", res.get("cv")))
        baselines.append(row(NO_ANSWER_ROW, "baseline", "CV", res.get("cv_all_no_answer")))
        if res.get("test") and res.get("is_dev_public"):
            rows.append(row(name, "ensemble", "dev_public", res["test"]))
    # the full dev_public baseline from the gold file itself (experiments may score a subset of it)
    dev_path = data.source_path("checklist_dev", data_dir)
    if dev_path.is_file():
        gold = metric.load_gold(dev_path)
        baselines.append(row(NO_ANSWER_ROW, "baseline", "dev_public", metric.evaluate(gold, {i: metric.NO_ANSWER for i in gold})))
    unique, seen = [], set()
    for b in baselines:  # one row per distinct question set (scores as shown in the table)
        shown = tuple(b[c] for c in COLUMNS)
        if b["questions"] is not None and shown not in seen:
            seen.add(shown)
            unique.append(b)
    return sorted(unique, key=lambda r: r["split"]) + rows


def to_markdown(rows: list[dict]) -> str:
    def cell(v):
        return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path):
    """dev_public F1 and EM overall / in-domain / per category, and CV F1 / EM, one bar per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    dev = [r for r in rows if r["split"] == "dev_public"]
    cv = [r for r in rows if r["split"] == "CV"]
    groups = ["overall", "in-domain"] + list(CATEGORIES)
    fig, axes = plt.subplots(3, 1, figsize=(12, 11))
    for ax, measure in zip(axes[:2], ("F1", "EM")):
        keys = [measure, f"{measure}_in-domain"] + [f"{measure}_{c}" for c in CATEGORIES]
        width = 0.8 / max(1, len(dev))
        for i, r in enumerate(dev):
            values = [r["_raw"].get(k) for k in keys]
            ax.bar(np.arange(len(groups)) + i * width, [np.nan if v is None else v for v in values], width,
                   label=f"{r['name']} ({r['questions']} q)")
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, groups)
        ax.set_ylabel(measure)
        ax.set_ylim(0, 100)
        ax.set_title(f"dev_public {measure} (official metric)")
        ax.legend(fontsize=7, loc="upper right")
    ax = axes[2]
    labels = [f"{r['name']}\n({r['questions']} q)" for r in cv]
    x = np.arange(len(cv))
    ax.bar(x - 0.2, [r["F1"] or 0 for r in cv], 0.4, label="F1")
    ax.bar(x + 0.2, [r["EM"] or 0 for r in cv], 0.4, label="EM")
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_title("cross-validation (out-of-fold) F1 / EM")
    ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    from mrc.io_utils import _atomic_write_bytes

    _atomic_write_bytes(path, buf.getvalue())


def write_report(rows: list[dict], out_dir: Path):
    import csv
    import io

    table = [{c: r[c] for c in COLUMNS} for r in rows]
    atomic_write_text(out_dir / "report.md", "# Backbone comparison (official DuReader-checklist metric)\n\n"
                      + to_markdown(table) + "\nCV: out-of-fold predictions of the training questions (K folds); "
                      "dev_public: dev_public.json (experiments trained with a dev cap score a subset: see questions).\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(table)
    atomic_write_text(out_dir / "report.csv", buf.getvalue())
    plot(rows, out_dir / "report.png")


def main(argv=None):
    args = build_parser().parse_args(argv)
    defaults = load_yaml_config("configs/default.yaml")
    out_root = _abs(args.output_dir or defaults["output_dir"])
    out_dir = _abs(args.out) if args.out else out_root / "report"
    rows = collect_rows(out_root, args.exps, args.ensembles, args.data_dir or defaults.get("data_dir"))
    write_report(rows, out_dir)
    print(to_markdown([{c: r[c] for c in COLUMNS} for r in rows]), end="")
    log.info("%d rows -> %s/report.{md,csv,png}", len(rows), out_dir)
    return 0


if __name__ == "__main__":
    runtime.run_main(main)
