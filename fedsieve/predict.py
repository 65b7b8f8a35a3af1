"""``fedsieve predict``: the registered model applied to image files, at the hub or at a
site with a model folder copied there.

    fedsieve predict PATH... [--model URI|DIR] [--out predictions.csv]

PATH is a folder (with ``labels.csv``: its rows, scored against their labels; without:
every image file under it), image files, or a label table. Each row of the output gives
the file, the predicted class, one probability per class, the label when known, and the
model's name and version. A file that cannot be read is listed with the reason and the
others are still predicted; the exit status is 1 when any file was refused. Images not at
the model's size are resized to it, and one line says how many, warning of mixed sizes as
the site's data check does.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from config.errors import OpsError

if TYPE_CHECKING:
    from federated.data import DatasetInfo
    from tasks.served_model import AppliedModel

__all__ = ["add_predict_arguments", "predict"]

BATCH = 256  # images decoded and predicted at a time: memory stays bounded
DEFAULT_MODEL = "models:/fedsieve-{dataset}@champion"


@dataclass(frozen=True)
class Item:
    """One image to predict: its file, how the output names it, and its label (if any)."""

    file: Path
    name: str
    label: str | None = None


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, help="folders, image files or a labels.csv")
    parser.add_argument(
        "--model",
        help="a models:/ or runs:/ URI, or a model folder (default: the champion of "
        "params.yaml's dataset, models:/fedsieve-<dataset>@champion)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("predictions.csv"),
        help="the CSV to write (default: predictions.csv)",
    )  # fmt: skip
    parser.add_argument(
        "--params", type=Path, default=Path("params.yaml"),
        help="the params whose dataset names the default model (default: params.yaml)",
    )  # fmt: skip


def predict(args: argparse.Namespace, workdir: Path) -> int:
    from federated.own_data import size_note
    from tasks.served_model import load_applied_model

    try:
        applied = load_applied_model(args.model or _default_model(workdir / args.params))
    except ValueError as error:
        raise OpsError(str(error)) from None
    volumes = applied.classifier.info.is_volume
    items = _items(args.paths, volumes)
    labels = applied.classifier.info.labels
    rows, refused, source_sizes = _predicted_rows(items, applied)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    columns = ["file", "class", *(f"p({label})" for label in labels), "label", "model",
               "version", "error"]  # fmt: skip
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    predicted = len(rows) - refused
    print(f"{args.out}: {predicted} {'volumes' if volumes else 'images'} predicted by "
          f"{applied.name} version {applied.version or '(not registered)'}, {refused} refused")  # fmt: skip
    resized = size_note(np.array(source_sizes).reshape(-1, 3 if volumes else 2),
                        applied.classifier.info.size, of=len(source_sizes))  # fmt: skip
    if resized:  # the site's data check says the same of its training images
        print(resized)
    scored = _score_line(rows, applied.classifier.info)
    if scored:
        print(scored, file=sys.stderr if scored.startswith("not scored") else sys.stdout)
    for row in rows:
        if row["error"]:
            print(f"fedsieve predict: {row['file']}: {row['error']}", file=sys.stderr)
    return 1 if refused else 0


def _default_model(params_file: Path) -> str:
    from config.params import load_params

    if not params_file.is_file():
        raise OpsError(f"--model: no {params_file} to name the dataset; give --model or --params")
    return DEFAULT_MODEL.format(dataset=load_params(params_file).data.dataset)


def _items(paths: list[Path], volumes: bool = False) -> list[Item]:
    """Every image the paths name, in order: a label table's rows, a folder's table (or
    its image files, sorted), single files. For a volume model a folder without a table
    holds volumes, or is one series (:func:`_volumes_in`)."""
    from federated.image_files import DICOM_SUFFIXES, IMAGE_SUFFIXES

    items: list[Item] = []
    for path in paths:
        table = path / "labels.csv" if path.is_dir() else path
        if table.suffix == ".csv" and table.is_file():
            items += _table_items(table)
        elif path.is_dir() and volumes:
            items += [Item(volume, str(volume)) for volume in _volumes_in(path)]
        elif path.is_dir():
            suffixes = IMAGE_SUFFIXES + DICOM_SUFFIXES
            found = sorted(f for f in path.rglob("*") if f.suffix.lower() in suffixes)
            items += [Item(f, str(f)) for f in found]
        elif path.exists():
            items.append(Item(path, str(path)))
        else:
            raise OpsError(f"{path}: no such file or folder")
    if not items:
        raise OpsError(f"no image files in {', '.join(map(str, paths))}")
    return items


def _volumes_in(folder: Path) -> list[Path]:
    """What a folder given to a volume model holds: its NIfTI files, DICOM files and
    folders (each a volume) when it holds a NIfTI file or a folder; else it is one series."""
    from federated.image_files import DICOM_SUFFIXES
    from federated.volume_files import NIFTI_SUFFIXES

    entries = sorted(entry for entry in folder.iterdir() if not entry.name.startswith("."))
    if not any(e.is_dir() or e.name.lower().endswith(NIFTI_SUFFIXES) for e in entries):
        return [folder]  # one series: a file a slice
    suffixes = NIFTI_SUFFIXES + DICOM_SUFFIXES
    return [e for e in entries if e.is_dir() or e.name.lower().endswith(suffixes)]


def _table_items(table: Path) -> list[Item]:
    try:
        with table.open(newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise OpsError(f"{table}: not a readable CSV table ({error})") from None
    if rows and "file" not in rows[0]:
        raise OpsError(f"{table}: no column file; a label table has file[, label]")
    return [Item(table.parent / row["file"], row["file"], row.get("label")) for row in rows]


def _predicted_rows(
    items: list[Item], applied: AppliedModel
) -> tuple[list[dict[str, str]], int, list[tuple[int, ...]]]:
    """One output row per item, predicted a batch at a time; how many were refused; and
    the size (height, width; a volume's depth too) each was read at before resizing."""
    labels = applied.classifier.info.labels
    rows, refused, source_sizes = [], 0, []
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        decoded = [applied.classifier.read_or_refuse(item.file) for item in batch]
        readable = [d.pixels for d in decoded if not isinstance(d, str)]
        source_sizes += [d.source_size for d in decoded if not isinstance(d, str)]
        prediction = applied.classifier.predict_images(readable)
        answers = iter(zip(prediction.classes, prediction.probabilities, strict=True))
        for item, result in zip(batch, decoded, strict=True):
            row = {"file": item.name, "label": item.label or "", "model": applied.name,
                   "version": applied.version, "class": "", "error": ""}  # fmt: skip
            if isinstance(result, str):
                row["error"], refused = result, refused + 1
            else:
                predicted, probabilities = next(answers)
                row["class"] = predicted
                row |= {
                    f"p({label})": f"{p:.6f}"
                    for label, p in zip(labels, probabilities, strict=True)
                }
            rows.append(row)
    return rows, refused, source_sizes


def _score_line(rows: list[dict[str, str]], info: DatasetInfo) -> str | None:
    """With labels: the accuracy and AUC of the predicted rows (labels by class name or
    index), as the training's metrics compute them."""
    from federated.metrics import accuracy_auc

    labelled = [r for r in rows if r["label"] and not r["error"]]
    if not labelled or info.multi_label:
        return None
    index = {name: i for i, name in enumerate(info.labels)}
    index |= {str(i): i for i in range(len(info.labels))}
    unknown = sorted({r["label"] for r in labelled if r["label"] not in index})
    if unknown:
        allowed = ", ".join(repr(label) for label in info.labels)
        return (f"not scored: label(s) {', '.join(map(repr, unknown))} are not classes of the "
                f"model; allowed: {allowed} (or 0..{len(info.labels) - 1})")  # fmt: skip
    targets = np.array([index[r["label"]] for r in labelled])
    scores = np.array([[float(r[f"p({label})"]) for label in info.labels] for r in labelled])
    acc, auc = accuracy_auc(scores, targets, multi_label=False)
    return f"scored against {len(labelled)} labels: accuracy {acc:.4f}, AUC {auc:.4f}"
