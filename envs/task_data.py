"""Problem sets for dataset-backed envs (math, QA, code), found on this machine and never downloaded.

``dataset_name`` names one of:
- a local file (``.json`` list of objects, ``.jsonl``, ``.parquet``) or a folder holding such files;
- a hub id (``owner/name``) whose files are already in the local Hugging Face hub cache
  (``huggingface-cli download --repo-type dataset owner/name`` on a machine with internet, or a copy of
  that cache folder).

Anything else raises ``DataUnavailable`` at once, saying how to provide the data: a run must not sit in
a download-retry loop on a machine without the hub. ``split`` picks the files whose name carries the
split (``train-00000-of-00001.parquet``, ``test.jsonl``); a single unnamed file is every split.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SUFFIXES = (".jsonl", ".json", ".parquet")
SPLIT_NAMES = ("train", "validation", "valid", "val", "test", "dev")


class DataUnavailable(ValueError):
    """The dataset a config names is not on this machine (the config key is ``dataset_name``)."""

    key = "dataset_name"


def _hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_snapshot(name: str) -> Path | None:
    """The newest cached snapshot folder of hub dataset ``name``, or None."""
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return None
    owner, repo = name.split("/")
    snapshots = _hub_cache() / f"datasets--{owner}--{repo}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted((p for p in snapshots.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def data_files(name: str) -> tuple[Path, list[Path]]:
    """The folder (or file) ``name`` stands for and its data files (see the module doc), or DataUnavailable."""
    name = str(name or "").strip()
    if not name:
        raise DataUnavailable("is empty: name a local .jsonl/.json/.parquet file or folder, or a hub dataset id "
                              "already in the local Hugging Face cache")
    path = Path(os.path.expanduser(name))
    if path.exists():
        root = path
    else:
        snapshot = hub_snapshot(name)
        if snapshot is None:
            raise DataUnavailable(
                f"{name!r} is neither a local file or folder nor a hub dataset in the local Hugging Face cache "
                f"({_hub_cache()}); nothing is downloaded at run time: point dataset_name at a local .jsonl/.json/"
                f".parquet file or folder, or fetch it first with `huggingface-cli download --repo-type dataset {name}`")
        root = snapshot
    if root.is_file():
        if root.suffix not in SUFFIXES:
            raise DataUnavailable(f"{name!r}: a data file must end in {', '.join(SUFFIXES)}")
        return root, [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in SUFFIXES and not p.name.startswith("."))
    if not files:
        raise DataUnavailable(f"{name!r}: the folder {root} holds no {', '.join(SUFFIXES)} file")
    return root, files


def split_files(root: Path, files: list[Path], split: str | None) -> list[Path]:
    """The files of ``split`` (by their names below ``root``); with no split asked, the train files when the set
    has named splits. A single file given by path is every split."""
    if root.is_file():
        return files
    named = {s: [f for f in files if _split_of(f.relative_to(root)) == s] for s in SPLIT_NAMES}
    named = {s: fs for s, fs in named.items() if fs}
    if split is None:
        return named.get("train", files) if named else files
    if split in named:
        return named[split]
    if not named:
        return files
    raise DataUnavailable(f"{root} has no split {split!r} (found: {', '.join(named)})")


def _split_of(path: Path) -> str | None:
    stem = path.name.split(".")[0].lower()
    for part in (stem, *(p.name.lower() for p in path.parents if p.name)):
        head = part.split("-")[0].split("_")[0]
        if head in SPLIT_NAMES:
            return head
    return None


def read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)
        if isinstance(rows, dict):  # {"data": [...]} layouts
            lists = [v for v in rows.values() if isinstance(v, list)]
            rows = lists[0] if len(lists) == 1 else [rows]
    if not all(isinstance(r, dict) for r in rows):
        raise DataUnavailable(f"{path}: every record must be a JSON object")
    return rows


def load_problems(name: str, split: str | None = None, required: tuple[str, ...] = ()) -> Any:
    """A ``datasets.Dataset`` of the records of ``name`` (and ``split``), checked to hold the ``required``
    fields. Read straight from the files: no download, no cache written."""
    from datasets import Dataset

    rows: list[dict[str, Any]] = []
    for path in split_files(*data_files(name), split):
        try:
            rows += read_rows(path)
        except (OSError, ValueError) as e:
            if isinstance(e, DataUnavailable):
                raise
            raise DataUnavailable(f"{path} cannot be read ({type(e).__name__}: {str(e)[:120]})") from None
    if not rows:
        raise DataUnavailable(f"{name!r} holds no records")
    missing = [k for k in required if k not in rows[0]]
    if missing:
        raise DataUnavailable(f"{name!r}: records have no field {missing[0]!r} (fields: {', '.join(rows[0])}); "
                              "set question_key / answer_key to the dataset's field names")
    return Dataset.from_list(rows)
