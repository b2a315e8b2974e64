"""The offline main job, end to end: (pre-train,) fine-tune, ensemble, report, submission.

    bash run.sh all [--budget_minutes 60] [--profile cpu] [--models bert ernie roberta --pretrain_share 0.25]

Stages, each a subprocess with this same python (its output also in <outputs>/run_all/logs/):
  1. pretrain.py --recipe R for the recipe of every backbone (configs/models/<model>.yaml), when
     --pretrain_share > 0 (default 0: at the cpu budget the minutes go further in fine-tuning)
  2. train.py --model X --exp X for each of --models (default ernie; exp X_<profile> for other profiles),
     data parallel over the cores (launch.py --nproc) for the cpu profile
  3. ensemble.py over the trained experiments -> submissions/<name>.json for dev_public.json
  4. report.py -> <outputs>/report/report.{md,csv,png}
The wall-clock budget is shared out as the run goes: each stage gets --max_minutes = the time left
(minus a reserve for ensemble and report) times its share among the stages still to run
(--pretrain_share of it for pre-training, the rest for fine-tuning), so a slow or skipped stage moves
time to the others. Resumable: finished stages (pretrain metrics.json, train cv.json, an ensemble
result newer than its members) are skipped, unfinished ones resume from their own checkpoints.
A failed pre-training or training is reported and the job goes on with what it has.
Ends with a one-screen summary: dev_public F1/EM of every member and of the ensemble next to
answering 'no answer' everywhere, and the wall time of each stage.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: F401,E402

import argparse  # noqa: E402
import logging  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT, atomic_write_json, atomic_write_text, load_yaml_config, read_json  # noqa: E402

log = logging.getLogger("mrc.run_all")
SRC = Path(__file__).resolve().parent


def build_parser():
    p = argparse.ArgumentParser(prog="bash run.sh all", description=__doc__.split("\n\n")[0])
    p.add_argument("--budget_minutes", type=float, default=60.0, help="wall-clock budget of the whole job (default 60)")
    p.add_argument("--profile", default="cpu", choices=["tiny", "cpu", "full"], help="size profile of every stage (default cpu)")
    p.add_argument("--models", nargs="+", default=["ernie"],
                   help="backbones to fine-tune (configs/models/; default ernie: on 2 cores one model given all the time "
                        "beats several sharing it)")
    p.add_argument("--pretrain_share", type=float, default=0.0,
                   help="share of the stage budget for pre-training each backbone's recipe first (default 0: none; "
                        "minutes of MLM did not help fine-tuning at this budget)")
    p.add_argument("--reserve_minutes", type=float, default=None,
                   help="kept for ensemble + report + slack (default: 8%% of the budget, at least 1.5)")
    p.add_argument("--nproc", type=int, default=None,
                   help="data-parallel CPU processes per pre-training/training stage (launch.py; default: every core for "
                        "the cpu profile, as 2 processes x 1 thread beat 1 x 2 here; 1 = one process)")
    p.add_argument("--skip_pretrain", action="store_true", help="fine-tune from whatever mrc.backbone resolves, no pre-training")
    p.add_argument("--name", default=None, help="ensemble / submission name (default ensemble_<profile>)")
    p.add_argument("--output_dir", default=None, help="outputs root (default: configs/default.yaml output_dir)")
    p.add_argument("--data_dir", default=None, help="data root (default: $MRC_DATA_DIR or ../shared/data)")
    p.add_argument("--submissions_dir", default="submissions", help="where the submission goes (default submissions/)")
    return p


def _abs(path) -> Path:
    path = Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


class Stage:
    def __init__(self, name, kind, share, argv, done, budget_flag=True, after=None):
        self.name, self.kind, self.share, self.argv, self.done = name, kind, share, argv, done
        self.budget_flag, self.after = budget_flag, after
        self.status, self.minutes, self.wall = "pending", None, None


def plan(args, out_root: Path, data_dir) -> tuple[list, dict]:
    """Stages in order and the names they use."""
    exps = {m: (m if args.profile == "cpu" else f"{m}_{args.profile}") for m in args.models}
    recipes = []
    for model in args.models:
        cfg_path = REPO_ROOT / "configs" / "models" / f"{model}.yaml"
        if not cfg_path.is_file():
            raise MRCError(f"{cfg_path}: no such backbone config (--models {model})")
        recipe = load_yaml_config(cfg_path).get("recipe")
        if recipe and recipe not in recipes:
            recipes.append(recipe)
    common = ["--data_dir", str(data_dir)] if data_dir else []
    nproc = args.nproc if args.nproc is not None else (os.cpu_count() or 1) if args.profile == "cpu" else 1

    def launched(script, stage_name, argv):  # data parallel through launch.py when nproc > 1
        if nproc <= 1:
            return [script, *argv]
        log_dir = out_root / "run_all" / "launch_logs" / stage_name.replace(" ", "_")
        return ["launch.py", script.removesuffix(".py"), "--nproc", str(nproc), "--log_dir", str(log_dir), *argv]

    stages = []
    if not args.skip_pretrain and args.pretrain_share > 0:
        for r in recipes:
            target = out_root / "pretrain" / r
            stages.append(Stage(f"pretrain {r}", "pretrain", args.pretrain_share / len(recipes),
                                launched("pretrain.py", f"pretrain {r}", ["--recipe", r, "--profile", args.profile, "--output", str(target), *common]),
                                done=lambda t=target: (t / "metrics.json").is_file()))
    train_share = (1 - args.pretrain_share) if not args.skip_pretrain and args.pretrain_share > 0 else 1.0
    for model, exp in exps.items():
        stages.append(Stage(f"train {exp}", "train", train_share / len(exps),
                            launched("train.py", f"train {exp}", ["--model", model, "--profile", args.profile, "--exp", exp,
                                                                  "--output_dir", str(out_root), *common]),
                            done=lambda e=exp: (out_root / e / "cv.json").is_file()))
    return stages, exps


def run_stage(stage: Stage, log_dir: Path) -> int:
    """Run one stage's script with this python; its output goes to the console and to a log file."""
    cmd = [sys.executable, str(SRC / stage.argv[0]), *stage.argv[1:]]
    if stage.budget_flag and stage.minutes is not None:
        cmd += ["--max_minutes", f"{stage.minutes:g}"]
    log_path = log_dir / (stage.name.replace(" ", "_") + ".log")
    log_dir.mkdir(parents=True, exist_ok=True)
    log.info("stage %s: %s", stage.name, " ".join(cmd[1:]))
    env = dict(os.environ, PYTHONPATH=str(SRC) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
    with open(log_path, "a", encoding="utf-8") as logf:
        logf.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO_ROOT, env=env,
                                text=True, errors="replace", bufsize=1)
        try:
            for line in proc.stdout:
                logf.write(line)
                logf.flush()  # the log is there to be tailed while the stage runs
                sys.stdout.write(f"[{stage.name}] {line}")
            return proc.wait()
        except BaseException:
            proc.terminate()  # Ctrl-C: stop the child (it resumes from its checkpoints on the next run)
            proc.wait()
            raise


def main(argv=None):
    args = build_parser().parse_args(argv)
    t0 = time.time()
    if args.budget_minutes <= 0:
        raise MRCError(f"--budget_minutes must be positive, got {args.budget_minutes}")
    if args.nproc is not None and args.nproc < 1:
        raise MRCError(f"--nproc must be at least 1, got {args.nproc}")
    if not 0 <= args.pretrain_share < 1:
        raise MRCError(f"--pretrain_share must be in [0, 1), got {args.pretrain_share}")
    defaults = load_yaml_config("configs/default.yaml")
    out_root = _abs(args.output_dir or defaults["output_dir"])
    data_dir = args.data_dir or defaults.get("data_dir")
    from mrc import data

    dev_path = data.source_path("checklist_dev", data_dir)
    if not dev_path.is_file():
        raise MRCError(f"{dev_path}: dev_public.json not found (set --data_dir or MRC_DATA_DIR)")
    name = args.name or f"ensemble_{args.profile}"
    reserve = args.reserve_minutes if args.reserve_minutes is not None else max(1.5, 0.08 * args.budget_minutes)
    deadline = t0 + 60 * args.budget_minutes
    run_dir = out_root / "run_all"
    stages, exps = plan(args, out_root, data_dir)
    record_path = run_dir / "stages.json"
    previous = read_json(record_path) if record_path.is_file() else {}

    for i, stage in enumerate(stages):
        if stage.done():
            stage.status = "done before"
            stage.wall = previous.get(stage.name, {}).get("wall_minutes")
            log.info("stage %s: finished before, skipping", stage.name)
            continue
        pending = [s for s in stages[i:] if not s.done()]
        left = (deadline - time.time()) / 60 - reserve
        stage.minutes = round(max(1.0, left * stage.share / sum(s.share for s in pending)), 2)
        start = time.time()
        code = run_stage(stage, run_dir / "logs")
        stage.wall = round((time.time() - start) / 60, 2)
        stage.status = "ok" if code == 0 and stage.done() else f"FAILED (exit {code})"
        if stage.status != "ok":
            log.warning("stage %s failed (exit %d): see %s; going on", stage.name, code, run_dir / "logs")
        previous[stage.name] = {"status": stage.status, "minutes_budget": stage.minutes, "wall_minutes": stage.wall}
        atomic_write_json(record_path, previous)

    trained = [exps[m] for m in args.models if (out_root / exps[m] / "cv.json").is_file()]
    tail = []
    if trained:
        ens = Stage("ensemble", "ensemble", 0, ["ensemble.py", "--exps", *trained, "--input", str(dev_path), "--name", name,
                                                 "--output_dir", str(out_root), "--submissions_dir", args.submissions_dir,
                                                 *(["--data_dir", str(data_dir)] if data_dir else [])],
                    done=lambda: _ensemble_current(out_root, name, trained, args.submissions_dir), budget_flag=False)
        tail.append(ens)
    tail.append(Stage("report", "report", 0, ["report.py", "--output_dir", str(out_root),
                                              *(["--data_dir", str(data_dir)] if data_dir else [])],
                      done=lambda: False, budget_flag=False))
    for stage in tail:
        if stage.done():
            stage.status = "done before"
            stage.wall = previous.get(stage.name, {}).get("wall_minutes")
            continue
        start = time.time()
        code = run_stage(stage, run_dir / "logs")
        stage.wall = round((time.time() - start) / 60, 2)
        stage.status = "ok" if code == 0 else f"FAILED (exit {code})"
        previous[stage.name] = {"status": stage.status, "wall_minutes": stage.wall}
        atomic_write_json(record_path, previous)

    summary = summarize(stages + tail, [exps[m] for m in args.models], name, out_root, args, time.time() - t0)
    atomic_write_text(run_dir / "summary.txt", summary)
    print(summary, end="")
    return 0 if all(s.status in ("ok", "done before") for s in stages + tail) else 1


def _ensemble_current(out_root: Path, name: str, members: list, submissions_dir) -> bool:
    """An ensemble result of exactly these members, newer than each member's training."""
    result = out_root / "ensemble" / name / "result.json"
    if not result.is_file() or not (_abs(submissions_dir) / f"{name}.json").is_file():
        return False
    if read_json(result).get("members") != members:
        return False
    return all(result.stat().st_mtime > (out_root / m / "cv.json").stat().st_mtime for m in members)


def summarize(stages, exps, name, out_root: Path, args, seconds: float) -> str:
    def scores(result):
        if not result:
            return "      -        -   "
        return f"{result['F1']:7.3f}  {result['EM']:7.3f}  ({result.get('TOTAL', '?')} q)"

    lines = ["", "=" * 78, f"offline main job ({args.profile} profile, budget {args.budget_minutes:g} min): "
             f"{seconds / 60:.1f} min wall", "-" * 78, f"{'stage':<26}{'status':<22}{'budget min':>11}{'wall min':>10}"]
    for s in stages:
        lines.append(f"{s.name:<26}{s.status:<22}{'' if s.minutes is None else f'{s.minutes:.1f}':>11}"
                     f"{'' if s.wall is None else f'{s.wall:.1f}':>10}")
    lines += ["-" * 78, f"dev_public, official metric{'':<12}F1       EM"]
    no_answer = None
    for exp in exps:
        path = out_root / exp / "cv.json"
        cv = read_json(path) if path.is_file() else {}
        no_answer = no_answer or cv.get("dev_all_no_answer")
        lines.append(f"  {exp:<36}{scores(cv.get('dev'))}")
    result_path = out_root / "ensemble" / name / "result.json"
    result = read_json(result_path) if result_path.is_file() else {}
    if result:
        lines.append(f"  {'ensemble ' + name:<36}{scores(result.get('test'))}")
        no_answer = result.get("test_all_no_answer") or no_answer
        w = ", ".join(f"{m} {x:.2f}" for m, x in zip(result["members"], result["weights"]))
        lines.append(f"    weights {w}; {result['threshold']['mode']} >= {result['threshold']['threshold']:.4g}; "
                     f"CV F1 {result['cv']['F1']:.3f}")
    lines.append(f"  {'no answer everywhere':<36}{scores(no_answer)}")
    lines.append("-" * 78)
    if result:
        lines.append(f"submission: {result['submission']}")
    lines.append(f"report:     {out_root / 'report' / 'report.md'} (.csv, .png)")
    lines.append(f"logs:       {out_root / 'run_all' / 'logs'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    runtime.run_main(main)
