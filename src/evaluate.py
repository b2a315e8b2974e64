"""Score a prediction file with the official DuReader-checklist metric: one JSON line.

usage: python src/evaluate.py GOLD.json PRED.json [--tag PREFIX]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: E402,F401
from mrc.metric import evaluate, load_gold, load_predictions  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gold", help="SQuAD/DuReader-format gold file")
    parser.add_argument("pred", help="JSON object {id: answer or 'no answer'}")
    parser.add_argument("--tag", default=None, help="score only question types starting with this prefix")
    args = parser.parse_args(argv)
    result = evaluate(load_gold(args.gold), load_predictions(args.pred), tag=args.tag)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}, ensure_ascii=False))


if __name__ == "__main__":
    runtime.run_main(main)
