"""`pgdrain.outcomes`: the name DESIGN.md gives the job outcomes in the package's API, a real
module (so that type checkers find it too), re-exporting pgdrain.api.outcomes' public names."""

from pgdrain.api.outcomes import Cancel, Discard, JobOutcome, RetryIn, Snooze

__all__ = ["Cancel", "Discard", "JobOutcome", "RetryIn", "Snooze"]
