"""The detector package's public names: each one resolves to the object its module defines, and a reader that needs
one record type does not load the rules."""

from __future__ import annotations

import subprocess
import sys

from looptrace.instrumentation import detector


def test_every_public_name_resolves_to_its_modules_object():
    import importlib

    for name in detector.__all__:
        home = importlib.import_module(f"{detector.__name__}.{detector._HOMES[name]}")
        assert getattr(detector, name) is getattr(home, name), name
    assert sorted(detector.__all__) == sorted(detector._HOMES)


def test_a_record_type_loads_without_the_rules():
    code = ("import sys\n"
            "from looptrace.instrumentation.detector import UnresolvedToolError, result_digest\n"
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('looptrace.instrumentation.detector.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['facts', 'identity']"


def test_an_unknown_name_is_an_attribute_error():
    try:
        detector.no_such_rule  # noqa: B018
    except AttributeError as exc:
        assert "no_such_rule" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")
