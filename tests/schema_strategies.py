"""Hypothesis strategies for the JSON schemas the MCP server advertises (the subset pydantic
writes for its input models: objects, $ref into $defs, anyOf, enum/const, strings with length
bounds and patterns, integers and numbers with bounds, booleans, null, arrays with bounds,
date-time strings). Values keep to the schema; the server may still refuse some (a NUL
character, a date its database cannot hold), which the tests accept as tool errors.
(hypothesis-jsonschema would do this, but it does not work with current hypothesis.)
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

TEXT_MAX = 60  # longer strings add nothing but time


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return _strategy(schema, schema.get("$defs", {}))


def _strategy(schema: dict[str, Any] | bool, defs: dict[str, Any]) -> st.SearchStrategy[Any]:
    if schema is True:
        schema = {}
    assert isinstance(schema, dict), schema
    if "$ref" in schema:
        return st.deferred(lambda: _strategy(defs[schema["$ref"].rsplit("/", 1)[1]], defs))
    if "anyOf" in schema:
        return st.one_of([_strategy(option, defs) for option in schema["anyOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, defs)
    if kind == "array":
        items = _strategy(schema.get("items", {}), defs)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "string":
        return _string(schema)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if isinstance(kind, list):
        return st.one_of([_strategy({**schema, "type": each}, defs) for each in kind])
    # No type: any JSON value (a free-form metadata object, say).
    return st.recursive(
        st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=5,
    )


def _object(schema: dict[str, Any], defs: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    fixed = {name: _strategy(properties[name], defs) for name in properties if name in required}
    optional = {name: _strategy(properties[name], defs) for name in properties if name not in required}
    extra = schema.get("additionalProperties")
    if not properties and extra is not False:
        values = _strategy(True if extra is None else extra, defs)
        return st.dictionaries(st.text(max_size=8), values, max_size=3)
    return st.fixed_dictionaries(fixed, optional=optional)


def _string(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if schema.get("format") == "date-time":
        moments = st.datetimes(datetime(1970, 1, 2), datetime(9999, 1, 1), timezones=st.just(UTC))
        return moments.map(lambda moment: moment.isoformat())
    low = schema.get("minLength", 0)
    high = max(low, min(schema.get("maxLength", TEXT_MAX), TEXT_MAX))
    text = st.text(min_size=low, max_size=high)
    if "pattern" in schema:
        pattern = re.compile(schema["pattern"])
        text = text.filter(lambda value: pattern.search(value) is not None)
    return text
