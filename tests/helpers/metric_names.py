"""Every CloudWatch metric name the function can emit, read from the code's own constants: each
module of pgdrain.aws that names a metric does so in a module-level `*_METRIC` string (or the
COUNT_METRICS map of drain's counters). A metric added that way is found here without a test
naming it, so a dashboard or a guide that leaves it out fails."""

from __future__ import annotations

import importlib
import pkgutil

import pgdrain.aws
from pgdrain.aws.metrics import COUNT_METRICS


def emitted_metrics() -> frozenset[str]:
    names = set(COUNT_METRICS.values())
    for info in pkgutil.iter_modules(pgdrain.aws.__path__):
        module = importlib.import_module(f"{pgdrain.aws.__name__}.{info.name}")
        for attribute, value in vars(module).items():
            if attribute.endswith("_METRIC") and isinstance(value, str):
                names.add(value)
    return frozenset(names)
