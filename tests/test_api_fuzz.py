"""Property-based fuzzing of the whole API against its live OpenAPI schema (schemathesis).

Every operation the schema lists at the time of the run gets generated requests, valid ones
(positive) and invalid ones (negative), sent in-process through Django's WSGI handler with an
admin key (so that every endpoint gets past its role check) of a workspace that holds a few
entries (one held), a link, a tombstone, a run, a dispute and open proposals. Half the positive
cases use real ids of that workspace in the path, so the handlers get past their lookups. Every
response must:

- not be a 5xx (never a 500 for any input; the server's exception fails the case);
- have a status code the operation declares;
- have a declared content type and a body matching the schema of its status;
- refuse (4xx) a request that breaks the schema (negative cases).

The operations are read from the schema, so a new endpoint is fuzzed without editing this
file. Together the operations make well over 1,000 requests per run
(test_the_fuzz_run_made_at_least_1000_requests checks it).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from maintenance.models import Dispute, MaintenanceRun, Proposal
from memory import accounts, entry_changes, new_entries, relationships
from memory.models import Entry

# Real commits: Django's handler calls close_old_connections around every request, which on
# PostgreSQL would close the connection holding a test's enclosing transaction.
pytestmark = pytest.mark.django_db(transaction=True)

APP = get_wsgi_application()
SCHEMA = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", APP)
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]
LABELS = [operation.label for operation in OPERATIONS]
CHECKS = [
    negative_data_rejection,
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES_PER_OPERATION = 30  # per mode: about 1,500 requests in all, 2 minutes on SQLite
MIN_TOTAL = 1000

# The kind of object a path id names, by the collection it follows ("/entries/{entry_id}").
OBJECTS = {"entries": "entry", "relationships": "relationship", "runs": "run", "disputes": "dispute"}

SENT: Counter[str] = Counter()
SECONDS: dict[str, float] = {}


@pytest.fixture
def fuzz_world(settings, tmp_path) -> dict[str, Any]:
    settings.BACKUP_DIR = tmp_path
    settings.API_RATE_LIMIT_PER_MINUTE = 0  # a thousand requests a minute is the point here
    workspace = accounts.workspace_create(slug="fuzz")
    entries = [
        new_entries.entry_create(workspace=workspace, content=f"fuzz memory {i} about retries", tags=["t"])
        for i in range(4)
    ]
    entry_changes.entry_tombstone(workspace=workspace, entry_id=entries[3].pk)
    link, _ = relationships.relationship_create(
        workspace=workspace, from_id=entries[0].pk, to_id=entries[1].pk
    )
    run = MaintenanceRun.objects.create(workspace=workspace, kind="full", trigger="cli", status="succeeded")
    dispute = Dispute.objects.create(
        workspace=workspace, entry_a=entries[0], entry_b=entries[1], detected_by="sweep"
    )
    # Open proposals to list, approve and reject, and a hold to release.
    for entry in entries[:3]:
        Proposal.objects.create(
            workspace=workspace,
            run=run,
            entry=entry,
            entry_ref=entry.pk,
            action="tombstone",
            reason="evicted",
            values={"retention": 0.1, "cold_threshold": 0.2},
            why="retention 0.10 < 0.20",
        )
    Entry.objects.filter(pk=entries[0].pk).update(held_at=timezone.now(), held_by="fuzz", hold_reason="keep")
    other = accounts.workspace_create(slug="other")
    new_entries.entry_create(workspace=other, content="another workspace's memory")
    _, key = accounts.api_key_create(workspace=workspace, name="fuzz", role="admin")
    return {
        "key": key,
        "ids": {
            "entry": [e.pk for e in entries],
            "relationship": [link.pk],
            "run": [run.pk],
            "dispute": [dispute.pk],
        },
    }


def _real_ids(path: str, ids: dict[str, list[int]]) -> dict[str, list[int]]:
    """For each path parameter, the real ids of the object kind it names."""
    found = {}
    for match in re.finditer(r"\{(\w+)\}", path):
        collection = path[: match.start()].rstrip("/").rsplit("/", 1)[-1]
        if collection in OBJECTS:
            found[match.group(1)] = ids[OBJECTS[collection]]
    return found


def _unsendable_query(query: dict[str, Any] | None) -> bool:
    """An object, or a list, for a query parameter: no parameter of the API takes an array
    (test_no_query_parameter_takes_an_array), so a list reaches the server as repeated strings
    (``tag=[False]`` is sent as ``tag=false``), a valid string the server rightly accepts while
    schemathesis counts it as invalid data (seen in CI)."""
    return any(isinstance(value, dict | list | tuple) for value in (query or {}).values())


def test_no_query_parameter_takes_an_array() -> None:
    """What _unsendable_query relies on: were an array parameter added, the fuzz would stop
    sending its lists, and this says so."""
    arrays = [
        (method, path, param["name"])
        for path, ops in SCHEMA.raw_schema["paths"].items()
        for method, op in ops.items()
        for param in op.get("parameters", [])
        if param["in"] == "query" and "array" in json.dumps(param.get("schema", {}))
    ]
    assert not arrays


def _fuzz(operation: Any, mode: GenerationMode, real: dict[str, list[int]], key: str) -> None:
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def send(case: Any, data: st.DataObject) -> None:
        # A query string carries only strings: an object (or a list holding one) generated for
        # a query parameter reaches the server as its Python repr, a valid string the server
        # rightly accepts, while schemathesis counts it as invalid data (seen in CI:
        # project={'\x1d\x1a': {...}}). Such cases say nothing about the API.
        assume(not _unsendable_query(case.query))
        if mode is GenerationMode.POSITIVE:
            for name, choices in real.items():
                if data.draw(st.booleans(), label=f"real {name}"):
                    case.path_parameters[name] = data.draw(st.sampled_from(choices), label=name)
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
        response = case.call()
        case.validate_response(response, checks=CHECKS)
        SENT[operation.label] += 1

    send()


def _fuzz_operation(label: str, world: dict[str, Any]) -> None:
    operation = SCHEMA.find_operation_by_label(label)
    assert operation is not None
    real = _real_ids(operation.path, world["ids"])
    started = time.monotonic()
    modes = [GenerationMode.POSITIVE]
    if any(True for _ in operation.iter_parameters()) or operation.body:
        modes.append(GenerationMode.NEGATIVE)  # else there is nothing to get wrong
    for mode in modes:
        _fuzz(operation, mode, real, world["key"])
    SECONDS[label] = time.monotonic() - started


def test_no_input_makes_the_api_fail_or_break_its_schema(fuzz_world):
    """Every operation of the published schema, in one test so that one process counts the
    whole run (the suite runs on several workers). A failing operation does not stop the
    others: every failure is reported at the end."""
    failures: dict[str, str] = {}
    for label in LABELS:
        try:
            _fuzz_operation(label, fuzz_world)
        except Exception as exc:  # a Hypothesis failure report, kept with its operation
            failures[label] = f"{type(exc).__name__}: {exc}"
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
    total = sum(SENT.values())
    assert set(SENT) == set(LABELS), set(LABELS) - set(SENT)
    assert total >= MIN_TOTAL, (total, SENT)
    slowest = sorted(SECONDS.items(), key=lambda item: -item[1])[:5]
    print(f"\n{total} fuzz requests over {len(LABELS)} operations; slowest: {slowest}; {dict(SENT)}")
