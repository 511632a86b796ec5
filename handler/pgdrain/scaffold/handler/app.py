"""The Lambda entry point (template.yaml: `Handler: app.lambda_handler`).

Settings and the job registry are read once per cold start; each event is handed to
pgdrain.aws.run, which drains, reports metrics as it goes, and continues if time ran out."""

from __future__ import annotations

import logging
import os
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from pgdrain.aws import run
from pgdrain.aws.metrics import metrics_namespace

LIBRARY_LOGGER = "pgdrain"

# POWERTOOLS_SERVICE_NAME names the service in every log line (template.yaml sets it).
logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME") or LIBRARY_LOGGER)
if logger.name != LIBRARY_LOGGER:
    # Powertools names its logger after the service; pgdrain's modules log under "pgdrain.*".
    # Give that logger the same handler (JSON, the invocation's keys) and level.
    library = logging.getLogger(LIBRARY_LOGGER)
    library.handlers = [logger.logger_handler]
    library.setLevel(logger.log_level)
    library.propagate = False
metrics = Metrics(namespace=metrics_namespace(os.environ))
runtime = run.cold_start(os.environ)


@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: Any, context: LambdaContext) -> dict[str, Any]:
    return run.handle(event, context, runtime, logger=logger, metrics=metrics)
