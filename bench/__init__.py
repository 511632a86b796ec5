"""Benchmarks: pgdrain against its own SQL ceiling and against PgQueuer and Procrastinate.

Run with `make bench` (it creates .venv-bench with the peers); `python -m bench.run --help`.
Nothing here is imported by pgdrain itself."""
