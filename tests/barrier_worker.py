"""Worker of tests/test_distributed.py: rank 0 reaches mrc.distributed.barrier() `--delay` seconds late
(longer than gloo's 30-second collective timeout); every rank then records when it left the barrier."""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from mrc import runtime  # noqa: E402,F401

from mrc.distributed import barrier, ensure_process_group, world_info  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--delay", type=float, default=35.0)
args = parser.parse_args()
ensure_process_group()
rank = world_info().rank
arrived = time.time() + (args.delay if rank == 0 else 0.0)
time.sleep(max(0.0, arrived - time.time()))
barrier()
left = time.time()
barrier()  # a second barrier reuses nothing of the first
Path(args.out).mkdir(parents=True, exist_ok=True)
(Path(args.out) / f"rank{rank}.json").write_text(json.dumps({"arrived": arrived, "left": left}))
