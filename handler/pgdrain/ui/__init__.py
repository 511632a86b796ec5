"""The web dashboard: queues, jobs, one job, the control plane, and the operator's actions on
them, served by Powertools' event handler behind a Lambda Function URL (lambda_entry.py) and by
`pgdrain ui` on 127.0.0.1 (local.py), the same routes for both (app.py)."""
