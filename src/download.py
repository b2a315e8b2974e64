"""Fetch the official DuReader-checklist train/dev/test1 tarball into data/ (`bash run.sh download`).

Needs the internet (the organisers' CDN); offline it fails with one line. `--archive FILE` unpacks a
tarball you already have. The files land in <dest>/mrc/dureader_checklist/{train,dev,test1}.json, so
`MRC_DATA_DIR=<dest>` (default data/) makes them the `checklist_train` / `checklist_dev_full` /
`checklist_test1` sources.
"""
import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mrc import runtime  # noqa: E402
from mrc.errors import MRCError  # noqa: E402
from mrc.io_utils import REPO_ROOT  # noqa: E402

URL = "https://dataset-bj.cdn.bcebos.com/lic2021/dureader_checklist.dataset.tar.gz"
WANTED = ("train.json", "dev.json", "test1.json")


def fetch(url: str, dest: Path, timeout: float) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out)
    except (urllib.error.URLError, OSError) as err:
        tmp.unlink(missing_ok=True)
        reason = getattr(err, "reason", err)
        raise MRCError(f"{url}: download failed ({reason}); offline? copy the tarball here and use --archive FILE") from None
    os.replace(tmp, dest)
    return dest


def unpack(archive: Path, dest_root: Path) -> list[Path]:
    """Extract the tarball and move its train/dev/test1 JSON files into <dest_root>/mrc/dureader_checklist/."""
    if not archive.is_file():
        raise MRCError(f"{archive}: archive not found")
    target = dest_root / "mrc" / "dureader_checklist"
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest_root) as tmp:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")  # refuses absolute paths and '..' members
        except (tarfile.TarError, EOFError, OSError) as err:
            raise MRCError(f"{archive}: not a readable tar archive ({err})") from None
        found = {p.name: p for p in Path(tmp).rglob("*.json") if p.name in WANTED}
        if not found:
            raise MRCError(f"{archive}: no {', '.join(WANTED)} inside the archive")
        placed = []
        for name, path in sorted(found.items()):
            os.replace(path, target / name)
            placed.append(target / name)
    return placed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=URL)
    parser.add_argument("--archive", type=Path, default=None, help="unpack this local tarball instead of downloading")
    parser.add_argument("--dest", type=Path, default=REPO_ROOT / "data", help="data dir to fill (default data/)")
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    archive = args.archive or fetch(args.url, args.dest / "dureader_checklist.dataset.tar.gz", args.timeout)
    for path in unpack(archive, args.dest):
        print(f"wrote {path}")
    runtime.log.info("use them with MRC_DATA_DIR=%s", args.dest)


if __name__ == "__main__":
    runtime.run_main(main)
