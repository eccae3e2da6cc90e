"""A run's tasks: an environment's own (``Env.load_tasks``), or a user's from a file (``env.tasks``).

A tasks file is JSON Lines (one object per line), JSON (a list of objects), parquet, or a directory written by
a Hugging Face ``datasets`` ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``). ``env.tasks.fields`` maps
the environment's task fields to the file's columns; the environment turns each row into a task
(``Env.task_from_row``): P4G reads personas (``user_id`` and either a ``persona`` text or any of
the built-in persona fields), tau2 reads tasks in upstream's task format (``id``, ``user_scenario``,
``evaluation_criteria``). A missing file, an unreadable row or a row without a field the environment needs is
a :class:`ValueError` (``FileNotFoundError`` for the file) naming the file and the row.

Splits: a ``DatasetDict``'s own, one path per split (``path: {train: a.jsonl, test: b.jsonl}``), a column
(``split_column``), or else a seeded random ``test_fraction`` of the rows as ``test`` and the rest as
``train``. ``all`` is every row."""
from __future__ import annotations

import json
import math
import os
import random
from typing import TYPE_CHECKING, Any

from ..types import Task

if TYPE_CHECKING:
    from ..config import EnvConfig, TasksConfig


def load_tasks(env: EnvConfig, split: str) -> list[Task]:
    """The tasks of ``split``: from ``env.tasks`` where it is set, else the environment's own."""
    from .base import get_env

    env_cls = get_env(env.name)
    if env.tasks is None:
        return env_cls.load_tasks(split, **env.options)
    rows = split_rows(env.tasks, split)
    tasks: list[Task] = []
    first: dict[str, str] = {}
    for where, row in rows:
        missing = {k: c for k, c in env.tasks.fields.items() if c not in row}
        if missing:
            raise ValueError(f"{where}: no column {', '.join(map(repr, missing.values()))} (env.tasks.fields: "
                             + ", ".join(f"{k}: {c}" for k, c in missing.items()) + ")")
        row = {**row, **{k: row[c] for k, c in env.tasks.fields.items()}}
        try:
            task = env_cls.task_from_row(row, split)
        except (KeyError, TypeError, ValueError) as e:
            msg = f"no field {e}" if isinstance(e, KeyError) else str(e)
            raise ValueError(f"{where}: {msg}") from None
        if task.id in first:
            raise ValueError(f"{where}: task id {task.id!r} again (first at {first[task.id]})")
        first[task.id] = where
        tasks.append(task)
    return tasks


def split_rows(tc: TasksConfig, split: str) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of ``split``'s rows, ``where`` naming the file and the row for errors."""
    if isinstance(tc.path, dict):
        if split == "all":
            return [r for p in tc.path.values() for r in read_rows(p)]
        if split not in tc.path:
            raise ValueError(f"env.tasks.path: no file for split {split!r} (have {', '.join(tc.path)})")
        return read_rows(tc.path[split])
    splits = read_splits(tc.path)
    if splits is not None:  # a DatasetDict
        if split == "all":
            return [r for rs in splits.values() for r in rs]
        if split not in splits:
            raise ValueError(f"{tc.path}: no split {split!r} (the dataset has {', '.join(splits)})")
        return splits[split]
    rows = read_rows(tc.path)
    if split == "all":
        return rows
    if tc.split_column is not None:
        lacking = [w for w, r in rows if tc.split_column not in r]
        if lacking:
            raise ValueError(f"{lacking[0]}: no column {tc.split_column!r} (env.tasks.split_column)")
        got = [(w, r) for w, r in rows if str(r[tc.split_column]) == split]
        if not got:
            have = sorted({str(r[tc.split_column]) for _, r in rows})
            raise ValueError(f"{tc.path}: no row with {tc.split_column} = {split!r} (have {', '.join(have)})")
        return got
    if split not in ("train", "test"):
        raise ValueError(f"{tc.path}: split {split!r}: without env.tasks.split_column a file has the splits "
                         "train, test (a seeded test_fraction of its rows) and all")
    order = list(range(len(rows)))
    random.Random(tc.split_seed).shuffle(order)
    test = set(order[:math.ceil(len(rows) * tc.test_fraction)])
    return [r for i, r in enumerate(rows) if (i in test) == (split == "test")]


def _is_dataset_dir(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f))
                                       for f in ("dataset_dict.json", "state.json", "dataset_info.json"))


def read_splits(path: str) -> dict[str, list[tuple[str, dict[str, Any]]]] | None:
    """A ``DatasetDict`` saved to disk: its rows by split; anything else: None."""
    if not (os.path.isdir(path) and os.path.exists(os.path.join(path, "dataset_dict.json"))):
        return None
    ds = _load_from_disk(path)
    return {name: [(f"{path} [{name}] row {i}", dict(r)) for i, r in enumerate(d)] for name, d in ds.items()}


def _load_from_disk(path: str) -> Any:
    from datasets import load_from_disk  # the `data` extra

    return load_from_disk(path)


def read_rows(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The rows of one file (or saved ``Dataset``), each with where it is (``FILE line N`` / ``FILE row N``)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"env.tasks: {path} not found")
    rows: list[tuple[str, Any]]
    if _is_dataset_dir(path):
        from datasets import DatasetDict

        ds = _load_from_disk(path)
        if isinstance(ds, DatasetDict):
            raise ValueError(f"{path}: a DatasetDict; name it without a split per path")
        rows = [(f"{path} row {i}", dict(r)) for i, r in enumerate(ds)]
    elif path.endswith(".parquet"):
        import pyarrow.parquet as pq  # the `data` extra

        rows = [(f"{path} row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist())]
    elif path.endswith((".jsonl", ".ndjson")):
        rows = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append((f"{path} line {n}", json.loads(line)))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {n}: not JSON ({e.msg})") from None
    elif path.endswith(".json"):
        try:
            data = json.load(open(path))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: a JSON tasks file holds a list of objects, not a {type(data).__name__}")
        rows = [(f"{path} item {i}", r) for i, r in enumerate(data)]
    else:
        raise ValueError(f"env.tasks: {path}: not a .jsonl, .json or .parquet file or a directory written by "
                         "datasets' save_to_disk")
    for where, r in rows:
        if not isinstance(r, dict):
            raise ValueError(f"{where}: a task is an object of fields, not a {type(r).__name__}")
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows
