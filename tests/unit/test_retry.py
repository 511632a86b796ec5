import pytest

from pgdrain.api.retry import RetryPolicy, backoff_seconds


def test_backoff_doubles_from_the_base_without_jitter() -> None:
    policy = RetryPolicy(base_seconds=10, cap_seconds=3600, jitter=0)
    assert [backoff_seconds(a, policy) for a in (1, 2, 3, 4)] == [10, 20, 40, 80]


@pytest.mark.parametrize("attempt", [7, 50, 10_000])
@pytest.mark.parametrize("r", [0.0, 0.5, 0.999])
def test_backoff_is_capped_even_at_absurd_attempts(attempt: int, r: float) -> None:
    policy = RetryPolicy(base_seconds=10, cap_seconds=60, jitter=0.25)
    assert backoff_seconds(attempt, policy, rand=lambda: r) <= 60


@pytest.mark.parametrize("r", [0.0, 0.25, 0.5, 0.75, 0.999999])
def test_jitter_stays_within_its_fraction(r: float) -> None:
    policy = RetryPolicy(base_seconds=10, cap_seconds=3600, jitter=0.25)
    delay = backoff_seconds(3, policy, rand=lambda: r)
    assert 30 <= delay <= 50  # 40 ± 25 %


def test_jitter_spreads_jobs_that_failed_together() -> None:
    policy = RetryPolicy(jitter=0.25)
    assert backoff_seconds(2, policy, rand=lambda: 0.0) < backoff_seconds(
        2, policy, rand=lambda: 0.99
    )


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError):
        backoff_seconds(0)


def test_policy_validates_itself() -> None:
    with pytest.raises(ValueError, match="cap_seconds"):
        RetryPolicy(base_seconds=10, cap_seconds=5)
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=2)


@pytest.mark.parametrize(
    "fields",
    [
        {"base_seconds": float("nan")},
        {"cap_seconds": float("nan")},
        {"cap_seconds": float("inf")},
        {"jitter": float("nan")},
    ],
)
def test_policy_refuses_numbers_that_are_not_finite(fields: dict[str, float]) -> None:
    # A NaN passes `<` checks as False: a NaN cap made every delay 0, an immediate retry.
    with pytest.raises(ValueError, match="finite"):
        RetryPolicy(**fields)
