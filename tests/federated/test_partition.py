import numpy as np
import pytest

from federated.partition import (
    PartitionError,
    build_partitioner,
    hold_out_local_tests,
    list_partitioners,
    partition_report,
)
from registry import RegistryError

LABELS = np.random.default_rng(0).integers(0, 5, size=2000)
SCHEMES = {
    "iid": {},
    "dirichlet": {"alpha": 0.5},
    "shards": {"classes_per_client": 2},
    "quantity": {"sigma": 1.0},
}


def test_every_registered_scheme_is_covered_here():
    assert sorted(SCHEMES) == list_partitioners()


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_parts_are_disjoint_cover_everything_and_are_sorted(scheme):
    parts = build_partitioner(scheme, **SCHEMES[scheme])(LABELS, 10, seed=3)

    joined = np.concatenate(parts)
    assert len(parts) == 10
    assert len(joined) == len(LABELS) == len(np.unique(joined))
    assert all((np.diff(p) > 0).all() for p in parts)


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_same_seed_same_parts_other_seed_other_parts(scheme):
    partitioner = build_partitioner(scheme, **SCHEMES[scheme])

    first, again, other = (partitioner(LABELS, 10, seed=s) for s in (1, 1, 2))

    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def _mean_label_entropy(parts):
    entropies = []
    for part in parts:
        p = np.bincount(LABELS[part], minlength=5) / len(part)
        p = p[p > 0]
        entropies.append(-(p * np.log(p)).sum())
    return float(np.mean(entropies))


def test_smaller_alpha_gives_more_label_skew():
    skews = [
        _mean_label_entropy(build_partitioner("dirichlet", alpha=a)(LABELS, 10, seed=0))
        for a in (100.0, 1.0, 0.1)
    ]

    assert skews[0] > skews[1] > skews[2]
    assert skews[0] > 0.95 * np.log(5)  # near-IID at large alpha


def test_shards_give_each_client_exactly_k_classes():
    parts = build_partitioner("shards", classes_per_client=2)(LABELS, 10, seed=0)

    assert all(len(np.unique(LABELS[p])) == 2 for p in parts)


def test_quantity_skew_keeps_labels_iid_but_varies_sizes():
    parts = build_partitioner("quantity", sigma=1.5, min_samples=5)(LABELS, 10, seed=0)
    sizes = [len(p) for p in parts]

    assert max(sizes) > 3 * min(sizes)
    assert min(sizes) >= 5


def test_too_many_clients_is_refused_naming_the_fix():
    with pytest.raises(PartitionError, match="fewer clients"):
        build_partitioner("iid", min_samples=10)(LABELS[:50], 10, seed=0)


def test_dirichlet_that_starves_a_client_is_refused_naming_alpha():
    with pytest.raises(PartitionError, match="raise alpha"):
        build_partitioner("dirichlet", alpha=0.01, min_samples=50, max_draws=5)(LABELS, 30, seed=0)


def test_label_skew_refuses_multi_label_data():
    multi = np.random.default_rng(0).integers(0, 2, size=(100, 3))
    with pytest.raises(PartitionError, match="single-label"):
        build_partitioner("dirichlet")(multi, 4, seed=0)


def test_bad_parameters_name_what_is_allowed():
    with pytest.raises(RegistryError, match="alpha must be a finite number > 0, got 0"):
        build_partitioner("dirichlet", alpha=0)
    with pytest.raises(RegistryError, match="accepted: min_samples"):
        build_partitioner("iid", alpha=0.5)
    with pytest.raises(RegistryError, match="available: dirichlet, iid, quantity, shards"):
        build_partitioner("pathological")


def test_report_holds_sizes_and_class_histograms():
    parts = [np.array([0, 1]), np.array([2])]
    report = partition_report(parts, np.array([0, 1, 1]), n_classes=2)

    assert report["clients"] == [
        {"client": 0, "size": 2, "classes": [1, 1]},
        {"client": 1, "size": 1, "classes": [0, 1]},
    ]
    assert (report["total"], report["size_min"], report["size_max"]) == (3, 1, 2)


def test_samples_are_grouped_by_owner_and_sorted_within_each_client():
    from federated.partition import group_by_client

    owners = np.array([2, 0, 2, 1, 0, 2])
    samples = np.array([9, 4, 1, 7, 3, 5])

    groups = group_by_client(owners, samples, num_clients=4)

    assert [g.tolist() for g in groups] == [[3, 4], [7], [1, 5, 9], []]


@pytest.mark.parametrize(
    ("scheme", "params"), [("dirichlet", {"alpha": 1.0}), ("shards", {}), ("iid", {})]
)
def test_a_population_of_100000_clients_is_split_into_disjoint_sorted_parts(scheme, params):
    labels = np.random.default_rng(0).integers(0, 10, size=1_000_000)

    parts = build_partitioner(scheme, **params)(labels, 100_000, seed=0)

    assert len(parts) == 100_000 and min(len(p) for p in parts) >= 1
    merged = np.concatenate(parts)
    assert len(merged) == len(labels) and len(np.unique(merged)) == len(labels)
    assert all(np.all(np.diff(p) > 0) for p in parts[:1000])


def test_local_test_splits_are_seeded_disjoint_and_a_share_of_each_client():
    parts = build_partitioner("iid")(np.zeros(1000, dtype=int), 7, seed=0)

    train, test = hold_out_local_tests(parts, 0.2, seed=3)

    assert [len(t) for t in test] == [int(0.2 * len(p)) for p in parts]
    for part, kept, held in zip(parts, train, test, strict=True):
        assert not set(kept) & set(held) and sorted([*kept, *held]) == sorted(part)
    again = hold_out_local_tests(parts, 0.2, seed=3)[1]
    other = hold_out_local_tests(parts, 0.2, seed=4)[1]
    assert all(np.array_equal(a, b) for a, b in zip(test, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(test, other, strict=True))
    assert all(len(t) == 0 for t in hold_out_local_tests(parts, 0.0, seed=3)[1])


def test_a_local_test_split_that_leaves_nothing_to_train_on_is_refused():
    with pytest.raises(PartitionError, match="client 1 holds 1 samples"):
        hold_out_local_tests([np.arange(5), np.arange(5, 6)], 0.5, seed=0)
