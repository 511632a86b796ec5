"""What `pgdrain demo` says about the warnings its flaky and failing jobs cause (no database)."""

from __future__ import annotations

from pgdrain.cli.demo import demo_jobs, explain_warnings


def test_each_warning_is_accounted_for() -> None:
    text = explain_warnings(3, retried=2, failed=1)
    assert text.startswith("warnings: 3, as the demo intends: 2 flaky jobs failed an attempt")
    assert "1 job failed for good" in text
    assert "other" not in text


def test_control_a_warning_the_demo_does_not_cause_is_not_explained_away() -> None:
    text = explain_warnings(4, retried=2, failed=1)
    assert text.endswith("1 other: see the function's log (the invoke above)")


def test_no_warning() -> None:
    assert explain_warnings(0, retried=0, failed=0) == "warnings: none"


def test_the_job_that_always_fails_is_the_last_one() -> None:
    """The demo inserts the last job on its own, to print `jobs show ID` with its id."""
    jobs = demo_jobs(120)
    assert [j.kind for j in jobs].count("fail") == 1
    assert jobs[-1].kind == "fail"
