"""The hub's round journal as its readers see it while a run writes it: whole lines of
the asked run only; a line still being written, another run's lines and a line that is
not a record are passed over, by the pipeline and by ``fedsieve check-simulation``."""

from __future__ import annotations

from pathlib import Path

from federated.server import RoundReport
from fedsieve.check_simulation import _round_times
from flowerapp.hub import HubFiles


def _journal(folder: Path) -> HubFiles:
    files = HubFiles(folder)
    files.folder.mkdir(parents=True)
    for token, round_number, elapsed in (("old", 1, 9.0), ("new", 1, 2.5), ("new", 2, 6.0)):
        report = RoundReport(round_number, {"test_acc": 0.5}, [], [])
        files.journal(report, token, elapsed_s=elapsed)
    with files.rounds.open("a") as out:
        out.write("not a record\n")
        out.write('{"run": "new", "round": 3, "elapsed_s": 9')  # still being written
    return files


def test_the_pipeline_reads_whole_lines_of_its_own_run(tmp_path: Path) -> None:
    files = _journal(tmp_path / "hub")

    reports, offset = files.journaled("new")

    assert [r.round for r in reports] == [1, 2]
    assert offset == files.rounds.read_bytes().rindex(b"\n") + 1  # the half line next time


def test_check_simulation_times_only_the_finished_rounds_of_the_last_run(tmp_path: Path) -> None:
    files = _journal(tmp_path / "hub")
    files.write_outcome("new", {"status": "finished"})

    assert _round_times(files) == {1: 2.5, 2: 3.5}
