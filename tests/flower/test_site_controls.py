"""A site's SCAFFOLD variate on its own disk: the start of each round, a round asked
again, a run started afresh, and what it no longer keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flowerapp.site_controls import KEPT, ControlStore, ControlStoreError

RUN = "ab12cd34ef56"


def test_a_round_starts_from_the_variate_of_the_sites_last_round_before_it(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    assert np.array_equal(store.before(1, 3), np.zeros(3, np.float32))  # never trained

    store.save(1, np.array([1.0, 2.0, 3.0]))
    store.save(3, np.array([4.0, 5.0, 6.0]))  # not sampled in round 2

    again = ControlStore(tmp_path, RUN)  # a site restarted: what its disk holds
    assert again.before(2, 3).tolist() == [1.0, 2.0, 3.0]
    assert again.before(3, 3).tolist() == [1.0, 2.0, 3.0]  # round 3 asked again
    assert again.before(4, 3).tolist() == [4.0, 5.0, 6.0]
    assert again.before(1, 3).tolist() == [0.0, 0.0, 0.0]  # a run started afresh


def test_a_round_asked_again_drops_what_came_after_it(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    for round_number in (1, 2, 3):
        store.save(round_number, np.full(2, float(round_number)))

    store.save(2, np.full(2, 20.0))  # the hub resumed from round 1's checkpoint

    assert store.before(3, 2).tolist() == [20.0, 20.0]
    assert store.before(4, 2).tolist() == [20.0, 20.0]  # round 3's variate is gone


def test_a_start_it_no_longer_keeps_is_refused_in_one_line(tmp_path: Path) -> None:
    store = ControlStore(tmp_path, RUN)
    for round_number in range(1, KEPT + 2):
        store.save(round_number, np.full(2, float(round_number)))

    assert store.before(3, 2).tolist() == [2.0, 2.0]
    with pytest.raises(ControlStoreError, match=r"^round 2 starts from .* before 2, which"):
        store.before(2, 2)
    with pytest.raises(ControlStoreError, match="has 2 values; the model has 5"):
        store.before(5, 5)


def test_runs_keep_their_own_variates_and_a_bad_run_key_is_refused(tmp_path: Path) -> None:
    ControlStore(tmp_path, RUN).save(1, np.ones(2))

    assert ControlStore(tmp_path, "0" * 12).before(2, 2).tolist() == [0.0, 0.0]
    with pytest.raises(ControlStoreError, match=r"run key '\.\./x' is not the hub's params hash"):
        ControlStore(tmp_path, "../x")
