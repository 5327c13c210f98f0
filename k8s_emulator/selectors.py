"""Label and field selectors as the API server parses them, and the JSON patch flavours it applies.

Label selectors: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a` (exists), `!a`, joined by
commas. Field selectors: `path=value`, `path==value`, `path!=value` over dotted paths such as
`metadata.name`, `spec.nodeName` or `status.phase`. Malformed ones raise `SelectorError` (a 400).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


class SelectorError(ValueError):
    """A selector or patch the API server would answer 400 BadRequest."""


def _split_terms(selector: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b=c` is two terms)."""
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def label_selector(selector: str | None) -> Predicate:
    """A predicate over an object's metadata.labels."""
    terms: list[tuple[str, str, frozenset[str]]] = []  # (key, operator, values)
    for term in _split_terms(selector or ""):
        if m := _SET_TERM.match(term):
            terms.append((m[1], m[2], frozenset(v.strip() for v in m[3].split(",") if v.strip())))
        elif m := _EQ_TERM.match(term):
            terms.append((m[1], "notin" if m[2] == "!=" else "in", frozenset([m[3]])))
        elif m := _EXISTS_TERM.match(term):
            terms.append((m[2], "!" if m[1] else "exists", frozenset()))
        else:
            raise SelectorError(f"unable to parse requirement: {term.strip()!r}")

    def holds(labels: Mapping[str, str], key: str, op: str, values: frozenset[str]) -> bool:
        if op == "in":
            return labels.get(key) in values
        if op == "notin":
            return labels.get(key) not in values
        return (key in labels) == (op == "exists")

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(holds(labels, *term) for term in terms)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string form of a dotted field (absent fields read as "", as the API server compares them)."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return "" if node is None else str(node)


def field_selector(selector: str | None) -> Predicate:
    """A predicate over dotted fields (equality and inequality only, as the API server supports)."""
    terms: list[tuple[str, bool, str]] = []  # (path, equal, value)
    for term in _split_terms(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*([^,]*?)\s*$", term)
        if m is None:
            raise SelectorError(f"invalid field selector: {term.strip()!r}")
        terms.append((m[1], m[2] != "!=", m[3]))

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in terms)

    return matches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge key by key, null deletes, anything else replaces.

    Strategic merge patch is served the same way: for labels, annotations and scalar fields the two
    agree; lists merged by key (containers by name) are replaced whole here.
    """
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise SelectorError(f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace and test (enough for labels, annotations, fields)."""
    if not isinstance(operations, list):
        raise SelectorError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, Mapping) or op.get("op") not in ("add", "remove", "replace", "test"):
            raise SelectorError(f"unsupported JSON patch operation {op!r}")
        *parents, last = _pointer(str(op.get("path", "")))
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.get(part) if isinstance(node, dict) else None
            if node is None:
                raise SelectorError(f"JSON patch path {op['path']!r} does not exist")
        kind = op["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(index, copy.deepcopy(op.get("value")))
            elif kind == "remove":
                node.pop(index)
            elif kind == "replace":
                node[index] = copy.deepcopy(op.get("value"))
            elif node[index] != op.get("value"):
                raise SelectorError(f"JSON patch test failed at {op['path']!r}")
        elif isinstance(node, dict):
            if kind in ("remove", "replace", "test") and last not in node:
                raise SelectorError(f"JSON patch path {op['path']!r} does not exist")
            if kind in ("add", "replace"):
                node[last] = copy.deepcopy(op.get("value"))
            elif kind == "remove":
                del node[last]
            elif node[last] != op.get("value"):
                raise SelectorError(f"JSON patch test failed at {op['path']!r}")
        else:
            raise SelectorError(f"JSON patch path {op['path']!r} does not exist")
    return doc
