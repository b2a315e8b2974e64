"""Shared fixtures. Real-data tests skip (with the reason) where the data dir is absent."""
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("MRC_OFFLINE", "1")  # the hub is unreachable here; skip the attempt in tests
os.environ.setdefault("OMP_NUM_THREADS", "2")

from mrc import runtime  # noqa: E402,F401  (env before paddle: threads, MKL_DEBUG_CPU_TYPE on AMD)
from mrc.data import resolve_data_dir  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = resolve_data_dir()
    if not (path / "mrc" / "dureader_checklist" / "dev_public.json").exists():
        pytest.skip(f"real data not found in {path} (set MRC_DATA_DIR to the shared data dir)")
    return path


def squad_json(questions, title="标题") -> dict:
    """A SQuAD-style document from (context, qas) pairs; qas are dicts written as given."""
    return {"data": [{"title": title, "paragraphs": [{"context": ctx, "title": title, "qas": qas} for ctx, qas in questions]}]}


@pytest.fixture
def write_json(tmp_path):
    def write(obj, name="file.json"):
        path = tmp_path / name
        path.write_text(obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False), encoding="utf-8")
        return path

    return write
