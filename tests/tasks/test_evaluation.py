import math

from tasks.evaluation import detection_totals, pooled_split_scores, rounds_to_target


def test_rounds_to_target_needs_accuracy_and_optionally_loss():
    rounds = [
        {"round": "1", "test_acc": "0.70", "test_loss": "0.9"},
        {"round": "2", "test_acc": "0.85", "test_loss": "0.6"},
        {"round": "3", "test_acc": "0.86", "test_loss": "0.4"},
    ]

    assert rounds_to_target(rounds, 0.8) == 2
    assert rounds_to_target(rounds, 0.8, target_loss=0.5) == 3
    assert rounds_to_target(rounds, 0.9) == -1


def test_detection_totals_sum_the_rounds_and_leave_undefined_ratios_empty():
    rounds = [
        {"true_positives": "2", "false_positives": "1", "false_negatives": "0"},
        {"true_positives": "1", "false_positives": "0", "false_negatives": "1"},
    ]
    nobody = [{"true_positives": "0", "false_positives": "0", "false_negatives": "0"}]

    assert detection_totals(rounds) == {
        "total_false_positives": 1.0,
        "total_false_negatives": 1.0,
        "detection_precision": 0.75,
        "detection_recall": 0.75,
    }
    assert detection_totals(nobody)["detection_precision"] is None


def test_scored_at_the_sites_the_final_scores_are_the_selected_rounds_row():
    rounds = [  # reports/rounds.csv read back: strings, a column some rows lack
        {"round": "1", "test_acc": "0.5", "test_auc": "0.6", "val_auc": "", "clients_kept": "3"},
        {"round": "2", "test_acc": "0.7", "test_auc": "nan", "val_auc": "0.8"},
    ]

    assert pooled_split_scores(rounds, 1) == {"test_acc": 0.5, "test_auc": 0.6}
    second = pooled_split_scores(rounds, 2)
    assert second["test_acc"] == 0.7 and second["val_auc"] == 0.8 and math.isnan(second["test_auc"])
