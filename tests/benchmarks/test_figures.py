"""Every figure of docs/results.md and README.md is generated from a record or stands in a
sentence citing a claim whose check passes: a typed figure fails, naming its line."""

from __future__ import annotations

import pytest

from benchmarks.evidence import figures, report

PASSING = {"C1", "C2"}


def unbacked(text: str, passing: set[str] = PASSING) -> list[str]:
    return [finding.figure for finding in figures.unbacked(text, "doc.md", passing)]


@pytest.mark.parametrize(
    "figure",
    ["0.731", "12.5 s", "1e13", "0.42M", "95 %", "6×", "3 of 10", "3/10", "± 2", "≈ 30",
     "529 images/s", "3.6 GB", "−0.02", "`0.731`"],
)  # fmt: skip
def test_a_typed_result_is_a_figure(figure):
    found = unbacked(f"The median ends at {figure} here.\n")

    assert len(found) == 1 and found[0].strip("`") in figure


@pytest.mark.parametrize(
    "setting",
    [
        "20 clients, 10 seeds and 20 rounds",  # a bare integer counts what was set up
        "Table 4 and Figure 2 of the paper, Sec. 5.3, Eq. 36, Theorem 5, issue 32",
        "an H100, a ResNet-18, SHA-256, x86-64 and float32",  # part of a name
        "images of 512×512 and a 3×3 stem",  # a size, not a ratio
        "the 95 % percentile bootstrap interval and 80 % power",  # a level
        "`--seeds 10`, `alpha: 0.1`, `torch 2.13` and `α = 0.5`",  # code holding more
        "[the guide](docs/x-0.5.md) and https://example.org/v1.2",  # links
        "<!-- 0.93 in an earlier run -->",
    ],
)
def test_a_setting_a_name_a_reference_or_code_is_not_a_figure(setting):
    assert unbacked(f"We ran {setting}.\n") == []


def test_a_figure_in_a_sentence_citing_a_passing_claim_stands_and_the_next_sentence_does_not():
    text = "FedAvg falls to 0.01 at a fifth [C1]. The median\nkeeps 0.94 without one.\n"

    findings = figures.unbacked(text, "doc.md", PASSING)

    assert [(f.line, f.figure) for f in findings] == [(2, "0.94")]
    assert str(findings[0]).startswith("doc.md:2: '0.94' is neither generated nor cited")


def test_a_claim_that_fails_or_is_unknown_backs_nothing():
    assert unbacked("FedAvg falls to 0.01 [C1, C3].\n") == ["0.01"]
    assert unbacked("FedAvg falls to 0.01 [C1].\n", passing=set()) == ["0.01"]


def test_a_generated_block_holds_figures_and_a_typed_table_fails_row_by_row():
    text = (
        "<!-- report:x -->\n| a | 0.5 |\n<!-- /report:x -->\n\n"
        "| method | ACC |\n|---|---|\n| fedavg | 0.94 |\n| median | 0.93 |\n"
    )

    findings = figures.unbacked(text, "doc.md", PASSING)

    assert [(f.line, f.figure) for f in findings] == [(7, "0.94"), (8, "0.93")]


def test_a_citation_in_one_list_item_does_not_back_the_next():
    text = "- FedAvg falls to 0.01 [C1]\n- the median keeps 0.94\n"

    assert unbacked(text) == ["0.94"]


def test_a_fenced_block_is_code():
    assert unbacked("```bash\nmake run   # about 0.5 s\n```\n") == []


def test_every_figure_of_the_results_and_the_readme_is_generated_or_cited():
    """The documents as committed: report.figure_problems reads the ledger's verdicts once
    (the same the report's check computes)."""
    assert report.figure_problems() == []
