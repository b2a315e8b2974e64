#!/usr/bin/env bash
# One entry point for the whole competition workflow. Every stage runs inside ./.venv (made on demand).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${MRC_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAGES="setup download data pretrain train predict ensemble report headroom bench all test"

usage() {
    echo "usage: bash run.sh {$(echo $STAGES | tr ' ' '|')} [--help] [stage flags]"
}

# stage -> entry point under src/ (stages not listed here are handled in this file)
declare -A SCRIPT=(
    [download]=download.py [data]=data_stats.py [pretrain]=pretrain.py [train]=train.py
    [predict]=predict.py [ensemble]=ensemble.py [report]=report.py [headroom]=headroom.py [bench]=bench.py [all]=run_all.py
)

setup() {
    local req="${MRC_REQUIREMENTS:-$ROOT/requirements.txt}"
    local stamp="$VENV/.installed"
    local want
    want="$(cat "$req" | sha256sum | cut -c1-16) $(python3 --version 2>&1)"
    if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        echo "setup: $VENV is up to date with $(basename "$req")"
        return 0
    fi
    echo "setup: installing $(basename "$req") into $VENV"
    [[ -x "$PY" ]] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
    echo "setup: done"
}

# True when the args hold a launcher flag of src/launch.py (LAUNCH_FLAGS there)
launch_requested() {
    local arg
    for arg in "$@"; do
        case "$arg" in --gpus|--gpus=*|--nproc|--nproc=*|--nnodes|--nnodes=*|--master|--master=*|--node_rank|--node_rank=*|--ips|--ips=*) return 0 ;; esac
    done
    return 1
}

# Threads: Paddle pins itself to one thread unless told otherwise. MKL's CPU path (MKL_DEBUG_CPU_TYPE=5 on
# AMD only) and paddle's stride kernels are set by src/mrc/runtime.py, which every Python entry point imports first.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore}"

stage="${1:-}"
[[ -n "$stage" ]] || { usage >&2; exit 2; }
shift

case "$stage" in
    -h|--help) usage; exit 0 ;;
    setup)
        [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && {
            echo "bash run.sh setup: create ./.venv and install requirements.txt (MRC_REQUIREMENTS=requirements-gpu.txt for GPU); a no-op when nothing changed"; exit 0; }
        [[ $# -eq 0 ]] || { echo "run.sh setup: unknown flag $1" >&2; usage >&2; exit 2; }
        setup ;;
    test)
        [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]] && {
            echo "bash run.sh test [pytest args]: run the test suite (tiny configs; real-data tests skip without the data dir)"; exit 0; }
        setup >/dev/null
        cd "$ROOT" && exec "$PY" -m pytest -q "$@" tests ;;
    *)
        script="${SCRIPT[$stage]:-}"
        [[ -n "$script" ]] || { echo "run.sh: unknown stage '$stage'" >&2; usage >&2; exit 2; }
        if [[ ! -f "$ROOT/src/$script" ]]; then
            echo "run.sh: stage '$stage' is not built yet (src/$script missing)" >&2
            exit 3
        fi
        setup >/dev/null
        if [[ "$stage" == bench && ! -x "$ROOT/.venv-bench/bin/python" && " $* " != *" --help "* && " $* " != *" -h "* ]]; then
            # the PyTorch side of the benchmark lives in its own venv, away from paddle's pins
            echo "bench: creating .venv-bench from requirements-bench.txt" >&2
            python3 -m venv "$ROOT/.venv-bench"
            "$ROOT/.venv-bench/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/requirements-bench.txt"
        fi
        # Data-parallel (several GPUs / CPU processes / machines): through paddle.distributed.launch
        if [[ "$stage" == pretrain || "$stage" == train ]] && launch_requested "$@"; then
            cd "$ROOT" && exec "$PY" src/launch.py "$stage" "$@"
        fi
        cd "$ROOT" && exec "$PY" "src/$script" "$@" ;;
esac
