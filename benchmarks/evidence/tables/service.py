"""The shell's measurements: a stop landing inside a tracking write
(benchmarks/sites/signal_in_write.py), reading a hospital's folder (benchmarks/sites/own_images.py)
and its CT series (benchmarks/speed/volume_read.py), and serving the model
(benchmarks/sites/serving.py)."""

from __future__ import annotations

from typing import Any

from benchmarks.evidence.tables.cells import ratio_check, table
from benchmarks.evidence.tables.records import results_json


def _pinned(record: dict[str, Any]) -> str:
    """The pinned stops' outcome: statuses, and how each close ended."""
    stops = record["pinned"]
    statuses = ", ".join(stop["status"] for stop in stops)
    closes = " and ".join(f"{stop['close_s']:.1f} s" for stop in stops)
    failed = {stop["failed"].split(":")[0] for stop in stops if stop["failed"]}
    how = f"the close failed ({', '.join(sorted(failed))}) after {closes}" if failed else (
        f"closed in {closes}"
    )  # fmt: skip
    return f"{statuses}: {how}"


def signal_block() -> str:
    """Stops landing inside a tracking write, before and after the store's calls moved to a
    thread of their own: the random stops' runs left RUNNING, the pinned stops, where the
    random stops landed and the longest close."""
    random = results_json("signal-in-write")
    after, before = (
        results_json("signal-in-write-pinned"),
        results_json("signal-in-write-pinned-before"),
    )
    left = random["trials"] - random["statuses"].get("KILLED", 0)
    rows = [
        ("on the main thread (before)", "– (seen in issue 46's test runs; no record kept)",
         _pinned(before)),
        ("on a thread of their own", f"**{left} of {random['trials']:,}**", _pinned(after)),
    ]  # fmt: skip
    header = ("store calls", "random stops: runs left RUNNING", "pinned stops (SIGINT, SIGTERM)")
    landed = ", ".join(f"{count} of {random['trials']:,} in `{where.rsplit('/', 1)[-1]}`"
                       for where, count in random["landed_in"].items())  # fmt: skip
    return (
        table(header, rows) + f"\nWhere the random stops landed: {landed}. The longest close took "
        f"{random['close_s_max']:.1f} s.\n"
    )


def own_images_block() -> str:
    """Reading a hospital's folder (benchmarks/sites/own_images.py): the library's bare decode,
    the floor of what our reader must do, the first read and the cached one, DICOM and
    PNG, with their goals."""
    dicom = results_json("own-images-cpu")
    png = dicom["png"]

    def rate(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:,.0f} images/s"

    rows = [
        ("the library's own decode, both cores (pydicom `pixel_array`, Pillow `load`)",
         rate(dicom, "decode_floor_images_per_s"), rate(png, "decode_floor_images_per_s")),
        ("the least our reader must do: read once, SHA-256, decode, resize",
         rate(dicom, "hash_decode_resize_floor_images_per_s"),
         rate(png, "hash_decode_resize_floor_images_per_s")),
        ("first read (`load_own_images`: all of that, the intensity policy, into the cache)",
         f"{rate(dicom, 'first_read_images_per_s')} ({dicom['first_read_s']:.1f} s)",
         f"{rate(png, 'first_read_images_per_s')} ({png['first_read_s']:.1f} s)"),
        (f"first read ÷ the library's decode (goal: ≥ {dicom['goal_ratio']:g})",
         f"{dicom['ratio_first_read_to_floor']:.2f} {'✓' if dicom['meets_ratio'] else '✗'}",
         f"{png['ratio_first_read_to_floor']:.2f} {'✓' if png['meets_ratio'] else '✗'}"),
        ("first read ÷ read, hash, decode, resize",
         f"{dicom['ratio_first_read_to_hash_decode_resize_floor']:.2f}",
         f"{png['ratio_first_read_to_hash_decode_resize_floor']:.2f}"),
        (f"cached read of the same {dicom['count']:,} (goal: ≤ {dicom['goal_cached_read_s']:g} s)",
         f"{dicom['cached_read_s']:.2f} s {'✓' if dicom['meets_cached'] else '✗'}",
         f"{png['cached_read_s']:.2f} s {'✓' if png['meets_cached'] else '✗'}"),
        ("cached arrays equal to the first read's",
         "yes" if dicom["cached_equal_first"] else "**no**",
         "yes" if png["cached_equal_first"] else "**no**"),
        ("the files", f"{dicom['count']:,}, {dicom['file_bytes'] / 1e9:.1f} GB",
         f"{png['count']:,}, {png['file_bytes'] / 1e9:.1f} GB"),
    ]  # fmt: skip
    return table(("", "DICOM", "PNG"), rows)


def volume_read_block() -> str:
    """Reading a folder of CT series (benchmarks/speed/volume_read.py): the floor and the
    first read, interleaved pass by pass, the least favourable pair's ratio (recomputed
    from the passes' times: the load of a shared machine only flatters) against its goal,
    the cached read."""
    r = results_json("volume-read-cpu")
    least = min(pair["floor_s"] / pair["first_read_s"] for pair in r["pairs"])
    rows = [
        (f"floor, pass {i + 1}: read once, SHA-256, decode, stack, resample, to 8 bits",
         f"{r['count'] / p['floor_s']:.2f} volumes/s ({p['floor_s']:.1f} s)", "")
        for i, p in enumerate(r["pairs"])
    ] + [
        (f"first read, pass {i + 1} (`load_own_images`: all of that, the geometry checks, "
         "the modality LUT and intensity policy, RAS+, into the cache)",
         f"{r['count'] / p['first_read_s']:.2f} volumes/s ({p['first_read_s']:.1f} s)",
         f"{p['ratio']:.2f} of its floor")
        for i, p in enumerate(r["pairs"])
    ] + [
        ("first read ÷ floor, the least favourable pair", f"{least:.2f}",
         ratio_check(least, r["goal_ratio"], at_most=False)),
        (f"cached read of the same {r['count']} series", f"{r['cached_read_s']:.2f} s",
         ratio_check(r["cached_read_s"], r["goal_cached_read_s"], at_most=True) + " (s)"),
        ("cached arrays equal to the first read's",
         "yes" if r["cached_equal_first"] else "**no**", ""),
        ("the series", f"{r['count']}, each {r['slices']} slices of {r['source_size']}² "
         f"({r['files']:,} files, {r['file_bytes'] / 1e9:.1f} GB), {r['workers']} workers",
         ""),
    ]  # fmt: skip
    encodings = ", ".join(r["encodings"].values())
    return table(("", "measured", "goal"), rows) + (
        f"\nEncodings, a series each in turn: {encodings}. Not written (no encoder here): "
        + "; ".join(r["not_written"].values())
        + ".\n"
    )


def serving_block() -> str:
    """The champion served over HTTP (benchmarks/sites/serving.py): latency, batch throughput
    beside the reader's own rate, answers equal to the in-process model's, and whether a
    run made to diverge registered a model."""
    r = results_json("serving-cpu")
    diverged = r["diverged_run"]
    rows = [
        (f"one DICOM a request (JSON, base64), {r['requests']} requests: p50 / p95",
         f"{r['p50_ms']:.1f} ms / {r['p95_ms']:.1f} ms",
         ratio_check(r["p50_ms"], r["goal_p50_ms"], at_most=True) + " (p50, ms)"),
        (f"batches of {r['batch']} DICOMs as a Parquet table of the files' bytes",
         f"{r['images_per_s']:.0f} images/s", ""),
        ("the same as JSON with base64", f"{r['images_per_s_json']:.0f} images/s", ""),
        ("the reader's own rate on the same files, one process (as the server)",
         f"{r['reader_images_per_s']:.0f} images/s", ""),
        ("batches ÷ the reader's rate", f"{r['batch_to_reader']:.2f}",
         ratio_check(r["batch_to_reader"], r["goal_batch_to_reader"], at_most=False)),
        ("REST answers equal to the in-process model's (1e-6)",
         "yes" if r["same_as_in_process"] else "**no**", "yes"),
        ("a run made to diverge registered a model (`diverged_run_registered`)",
         "yes" if r["diverged_run_registered"] else "no", "no"),
        ("the diverged run's last line", f"`{diverged['last_line']}` (exit {diverged['exit_code']})", ""),
    ]  # fmt: skip
    return table(("", "measured", "goal"), rows)
