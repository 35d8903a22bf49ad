"""The detector on real recorded agent runs (../shared/trajectories), against the labels in benchmarks/.

A guard against regressions on real data, not a second benchmark: the figures themselves are printed by
``python -m benchmarks --only detector-eval``. Skipped, saying so, where the corpus is not beside the checkout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def evaluation():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(ROOT))
        from benchmarks import detector_eval

        corpus = detector_eval.corpus_dir()
        if not corpus.is_dir():
            pytest.skip(f"no trajectory corpus at {corpus} (set {detector_eval.CORPUS_ENV} to point at one)")
        return detector_eval.evaluate(corpus)


@pytest.fixture(scope="module")
def per_file(evaluation):
    return evaluation["per_file"]


def test_every_anomaly_type_is_right_at_least_nine_times_in_ten_on_real_runs(evaluation):
    for kind, line in evaluation["table"].items():
        assert line["true"] >= 0.9 * line["flags"], (kind, line["false_alarms"])


def test_every_type_is_right_nine_times_in_ten_in_every_file_where_it_fires_five_times_or_more(per_file):
    below = {(source, kind): (line["true"], line["labelled"], line["wrong"])
             for source, kinds in per_file.items() for kind, line in kinds.items()
             if line["flags"] >= 5 and line["true"] < 0.9 * line["labelled"]}
    assert below == {}, below


def test_every_flag_of_the_labelled_sample_has_been_read(per_file):
    # A rule that starts flagging runs nobody read has no measured precision: label them (by reading) first.
    unlabelled = {(source, kind): line["unlabelled"] for source, kinds in per_file.items()
                  for kind, line in kinds.items() if line["unlabelled"]}
    assert unlabelled == {}, unlabelled


def test_the_coding_agents_are_in_the_evaluation(per_file):
    assert {"swe-vorflux", "openhands-sdk"} <= set(per_file)


def test_the_replay_raises_no_detector_fault(evaluation):
    assert evaluation["faults"] == []


def test_the_loops_people_labelled_are_caught_at_least_eight_times_in_ten(evaluation):
    for kind in ("repeated_call", "failing_tool"):
        line = evaluation["table"][kind]
        assert line["true"] >= 0.8 * line["labelled"], (kind, line["misses"])


def test_an_answer_that_claims_a_failed_operation_in_its_own_run_is_caught(evaluation):
    caught, labelled = evaluation["table"]["ignored_error"]["recall_run"]
    assert labelled and caught >= 0.8 * labelled, evaluation["table"]["ignored_error"]["misses"]
