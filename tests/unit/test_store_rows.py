"""The store's row encoding: the hand-written JSON of names and acquisition paths is the encoder's, byte for byte."""

from __future__ import annotations

import json

import pytest

from broker.jobs import Acquisition
from broker.store.rows import _acquisition, _names

TRICKY = ["", "pod-1", "a b", 'quo"te', "back\\slash", "new\nline", "tab\t", "\x1f", "\x7f", "ünï 🚀", "\u2028",
          "</script>"]


def _encoded(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("names", [(), ("p-1",), ("p-1", "p-2", "p-3"), *((n,) for n in TRICKY), tuple(TRICKY)])
def test_pod_names_encode_exactly_as_the_json_encoder_writes_them(names: tuple[str, ...]) -> None:
    assert _names(names) == _encoded(list(names))
    assert json.loads(_names(names)) == list(names)


@pytest.mark.parametrize("acquisition", [
    (),
    (Acquisition("p-1", "warm", "idle"),),
    (Acquisition("p-1", "cold", None), Acquisition("p-2", "standby", "promoted")),
    *((Acquisition(n, "warm", "idle"),) for n in TRICKY),
    *((Acquisition("p-1", n, None),) for n in TRICKY),
    *((Acquisition("p-1", "warm", n),) for n in TRICKY),
])
def test_acquisition_paths_encode_exactly_as_the_json_encoder_writes_them(
        acquisition: tuple[Acquisition, ...]) -> None:
    assert _acquisition(acquisition) == _encoded([a.to_json() for a in acquisition])
