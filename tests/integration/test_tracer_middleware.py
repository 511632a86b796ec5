"""The Powertools Tracer middleware (pgdrain.aws.tracing) through a real drain: each job in its
own subsegment with its annotations, its exception seen, no payload recorded. The provider is a
recording one (Tracer(provider=...)): aws-xray-sdk is not a dependency here."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest
from aws_lambda_powertools import Tracer
from aws_lambda_powertools.tracing.base import BaseProvider

from pgdrain import Budget, Job, Registry, Settings, drain, enqueue
from pgdrain.aws.tracing import tracer_middleware

Conn = psycopg.Connection[Any]


class Segment:
    def __init__(self, name: str) -> None:
        self.name = name
        self.annotations: dict[str, Any] = {}
        self.metadata: dict[str, Any] = {}
        self.error: BaseException | None = None

    def put_annotation(self, key: str, value: Any) -> None:
        self.annotations[key] = value

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        self.metadata[key] = value


class RecordingProvider(BaseProvider):
    def __init__(self) -> None:
        self.segments: list[Segment] = []

    @contextlib.contextmanager
    def in_subsegment(self, name: Any = None, **kwargs: Any) -> Iterator[Any]:
        segment = Segment(str(name))
        self.segments.append(segment)
        try:
            yield segment
        except BaseException as exc:
            segment.error = exc  # as X-Ray's subsegment records the exception
            raise

    def in_subsegment_async(self, name: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError

    def put_annotation(self, key: str, value: Any) -> None:
        pass

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        pass

    def patch(self, modules: Sequence[str]) -> None:
        pass

    def patch_all(self) -> None:
        pass


@pytest.fixture
def provider() -> Iterator[RecordingProvider]:
    recording = RecordingProvider()
    yield recording
    Tracer._reset_config()  # Tracer's configuration is shared by every instance


def test_each_job_runs_in_its_own_annotated_subsegment(
    db_url: str, conn: Conn, provider: RecordingProvider
) -> None:
    jobs = Registry()
    jobs.middleware(
        tracer_middleware(
            Tracer(service="pgdrain-test", provider=provider, disabled=False, auto_patch=False)
        )
    )

    @jobs.job("ok")
    def ok(job: Job) -> None:
        pass

    @jobs.job("boom")
    def boom(job: Job) -> None:
        raise ValueError("boom")

    ok_id = enqueue(conn, "ok", {"secret": "s3cr3t"})
    boom_id = enqueue(conn, "boom", {"secret": "s3cr3t"}, priority=1)
    drain(Settings(concurrency=1), Budget.seconds(30), jobs, db_url)

    [first, second] = provider.segments
    assert (first.name, second.name) == ("## job ok", "## job boom")
    assert first.annotations == {
        "job_id": str(ok_id),
        "job_kind": "ok",
        "job_queue": "default",
        "job_attempt": "1",
    }
    assert second.annotations["job_id"] == str(boom_id)
    assert first.error is None and isinstance(second.error, ValueError)
    assert "s3cr3t" not in repr([s.annotations | s.metadata for s in provider.segments])
