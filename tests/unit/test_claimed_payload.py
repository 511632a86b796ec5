"""ClaimedJob.payload reads jsonb's text with JSONDecoder.raw_decode, and anything else the way
json.loads does: the same value, or the same error."""

from __future__ import annotations

import json
import uuid

import pytest

from pgdrain.db.store import ClaimedJob

RUN_AT_US = 1_767_225_600_000_000  # a claimed job's run_at (2026-01-01) in microseconds


def claimed(payload_json: str) -> ClaimedJob:
    return ClaimedJob(1, "default", "k", payload_json, 1, 5, uuid.uuid4(), 0, RUN_AT_US)


@pytest.mark.parametrize(
    "text",
    ["{}", '{"a": [1, 2.5, null]}', '"x"', "3", "null", ' {"a": 1}', '{"a": 1}\n', "\t[]  "],
)
def test_a_payload_reads_as_json_loads_reads_it(text: str) -> None:
    assert claimed(text).payload == json.loads(text)


@pytest.mark.parametrize("text", ["{} x", "", "{", "[1, 2] [3]"])
def test_a_text_json_loads_refuses_is_refused_the_same_way(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as refused:
        claimed(text).payload  # noqa: B018 (the property is what is tested)
    assert str(refused.value) == str(expected.value)
