"""Atomic writes, config loading and run records: nothing half-written survives a kill."""
import io
import json
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import yaml

from .errors import MRCError

REPO_ROOT = Path(__file__).resolve().parents[2]
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _atomic_write_bytes(path, data: bytes):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs should read like any written file
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str):
    _atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, obj, indent=2):
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=indent, sort_keys=False) + "\n")


def atomic_save_npz(path, **arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    _atomic_write_bytes(path, buf.getvalue())


def read_json(path):
    """Parse a JSON file; any failure is one line naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise MRCError(f"{path}: file not found") from None
    except UnicodeDecodeError as err:
        raise MRCError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise MRCError(f"{path}: malformed JSON ({err.msg} at line {err.lineno} column {err.colno})") from None


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_yaml_config(*paths, overrides=None) -> dict:
    """Deep-merge YAML files in order, then `overrides` (a dict; None values are ignored)."""
    config = {}
    for path in paths:
        path = Path(path)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / path
        try:
            with open(path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise MRCError(f"{path}: config file not found") from None
        except yaml.YAMLError as err:
            raise MRCError(f"{path}: malformed YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(loaded, dict):
            raise MRCError(f"{path}: a config file must be a mapping")
        config = _deep_merge(config, loaded)
    if overrides:
        config = _deep_merge(config, {k: v for k, v in overrides.items() if v is not None})
    return config


def write_run_info(out_dir, config: dict, seed: int, metrics: dict | None = None):
    """Record what produced an output dir: resolved config + seed (config.yaml) and metrics.json."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "config.yaml", yaml.safe_dump({**config, "seed": seed}, allow_unicode=True, sort_keys=False))
    if metrics is not None:
        atomic_write_json(out_dir / "metrics.json", metrics)


def set_all_seeds(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    try:
        import paddle

        paddle.seed(seed)
    except ImportError:
        pass
