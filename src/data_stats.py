"""Read every MRC file in the data dir and print counts per source (`bash run.sh data`)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: E402,F401
from mrc.data import SOURCES, corpus_path, load_file, resolve_data_dir, source_path  # noqa: E402
from mrc.errors import MRCError  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=None, help="data dir (default: $MRC_DATA_DIR, ../shared/data, data/)")
    parser.add_argument("--strict", action="store_true", help="fail on the first bad question instead of skipping it")
    args = parser.parse_args(argv)
    data_dir = resolve_data_dir(args.data_dir)
    print(f"data dir: {data_dir}")
    header = f"{'source':<19}{'questions':>10}{'answerable':>11}{'unanswer.':>10}{'skipped':>8}  skipped why / repaired"
    print(header)
    print("-" * len(header))
    totals = [0, 0, 0, 0]
    found = 0
    for name in SOURCES:
        path = source_path(name, data_dir)
        if not path.exists():
            print(f"{name:<19}not present ({path})")
            continue
        found += 1
        df, report = load_file(path, source=name, strict=args.strict)
        unanswerable = int(df["is_impossible"].sum())
        row = [len(df), len(df) - unanswerable, unanswerable, report.total_skipped]
        totals = [a + b for a, b in zip(totals, row)]
        why = ", ".join(f"{k} {v}" for k, v in report.skipped.items())
        fixed = ", ".join(f"{k} {v}" for k, v in report.repaired.items())
        print(f"{name:<19}{row[0]:>10}{row[1]:>11}{row[2]:>10}{row[3]:>8}  {why}{' | repaired: ' + fixed if fixed else ''}")
    print("-" * len(header))
    print(f"{'total':<19}{totals[0]:>10}{totals[1]:>11}{totals[2]:>10}{totals[3]:>8}")
    corpus = corpus_path(data_dir)
    if corpus.exists():
        with open(corpus, encoding="utf-8") as f:
            lines = sum(1 for line in f if line.strip())
        print(f"corpus: {corpus} ({lines} documents, {corpus.stat().st_size / 1e6:.1f} MB)")
    if not found:
        raise MRCError(f"{data_dir}: no MRC files found (set --data_dir or $MRC_DATA_DIR; see data/README.md)")


if __name__ == "__main__":
    runtime.run_main(main)
