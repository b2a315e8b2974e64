"""K folds made once and saved: StratifiedGroupKFold grouped by passage, stratified by answerable.

outputs/folds.csv (columns id, fold) is reused by every later run and model, so out-of-fold
predictions of different experiments line up for ensembling. A saved file that does not match the
ids being trained on (other questions, other K) is an error, never silently remade.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import StratifiedGroupKFold

from .errors import MRCError
from .io_utils import atomic_write_text


def make_folds(df: pd.DataFrame, n_folds: int, seed: int) -> pd.DataFrame:
    """DataFrame (id, fold): no passage in two folds, answerable share about equal in every fold."""
    if n_folds < 2:
        raise MRCError(f"--folds must be at least 2, got {n_folds}")
    n_groups = df["passage_id"].nunique()
    if n_groups < n_folds:
        raise MRCError(f"{n_folds} folds need at least {n_folds} distinct passages, the data has {n_groups}")
    splitter = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    fold = np.full(len(df), -1, dtype=np.int64)
    y = (~df["is_impossible"].astype(bool)).astype(int).to_numpy()
    for k, (_, valid) in enumerate(splitter.split(np.zeros(len(df)), y, groups=df["passage_id"].to_numpy())):
        fold[valid] = k
    return pd.DataFrame({"id": df["id"].astype(str).to_numpy(), "fold": fold})


def load_or_make_folds(df: pd.DataFrame, path, n_folds: int, seed: int) -> pd.Series:
    """Fold of every row of `df` (Series indexed like df). Makes and saves `path` when it is missing."""
    path = Path(path)
    ids = df["id"].astype(str)
    if path.exists():
        try:
            saved = pd.read_csv(path, dtype={"id": str, "fold": int})
        except (ValueError, pd.errors.ParserError) as err:
            raise MRCError(f"{path}: unreadable folds file ({err}); delete it to make new folds") from None
        if list(saved.columns) != ["id", "fold"]:
            raise MRCError(f"{path}: expected columns id,fold, found {','.join(saved.columns)}")
        if set(saved["id"]) != set(ids) or len(saved) != len(ids):
            extra = sorted(set(saved["id"]) - set(ids))[:2]
            missing = sorted(set(ids) - set(saved["id"]))[:2]
            raise MRCError(f"{path}: saved folds do not match the training questions ({len(saved)} saved, {len(ids)} now; "
                           f"e.g. only saved {extra}, only now {missing}); use the same data/profile, or delete it "
                           f"(or pass --folds_file) to make new folds")
        found = saved["fold"].nunique()
        if found != n_folds:
            raise MRCError(f"{path}: holds {found} folds but --folds is {n_folds}; delete it to make new folds")
        folds = saved
    else:
        folds = make_folds(df, n_folds, seed)
        atomic_write_text(path, folds.to_csv(index=False))
    fold_of = dict(zip(folds["id"], folds["fold"]))
    return pd.Series([fold_of[i] for i in ids], index=df.index, name="fold")


def trained_folds(info: dict) -> list[int]:
    """Folds an experiment trained (train_info.json): all K unless --train_folds chose the first few
    (a single fold of 5 = 80% of the data for training, 20% for the out-of-fold threshold)."""
    return [int(k) for k in info.get("trained_folds", range(int(info["folds"])))]
