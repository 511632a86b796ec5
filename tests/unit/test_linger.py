"""How long a run with nothing to claim lingers for a burst's next kick (aws/control.py)."""

from __future__ import annotations

import pytest

from pgdrain.aws.control import LINGER_STEPS, MAX_LINGER_SECONDS, linger_step

WINDOW = 2.0


def test_a_run_kicked_just_now_claims_again_after_an_eighth_of_the_window() -> None:
    assert linger_step(0.1, WINDOW, time_left_s=60) == WINDOW / LINGER_STEPS


def test_the_last_step_ends_where_the_window_does() -> None:
    assert linger_step(1.9, WINDOW, time_left_s=60) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kick_age_s", "window_s", "time_left_s"),
    [
        (2.0, WINDOW, 60),  # a window has passed since the last kick
        (None, WINDOW, 60),  # its queues were never kicked (a scheduled run)
        (0.1, 0.0, 60),  # no debounce window, no linger
        (0.1, WINDOW, 0.2),  # the wait would reach into the reserve
    ],
    ids=["window-passed", "never-kicked", "no-window", "budget"],
)
def test_the_run_exits(kick_age_s: float | None, window_s: float, time_left_s: float) -> None:
    assert linger_step(kick_age_s, window_s, time_left_s) == 0.0


def test_a_long_debounce_window_does_not_keep_an_idle_run_alive() -> None:
    assert linger_step(MAX_LINGER_SECONDS, 3600.0, time_left_s=900) == 0.0
    assert linger_step(0.0, 3600.0, time_left_s=900) == MAX_LINGER_SECONDS / LINGER_STEPS
