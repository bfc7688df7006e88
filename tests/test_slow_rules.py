"""conftest's slow rules name tests and fixtures that exist: a test renamed or moved must not leave the quick loop
(`python -m pytest -m "not slow"`) paying for it without a word."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import SLOW_FIXTURES, SLOW_TESTS


def test_every_name_in_the_slow_rules_is_a_test_or_a_fixture_of_the_suite():
    defined = set()
    for path in Path(__file__).parent.glob("*.py"):
        defined |= set(re.findall(r"^(?:async )?def (\w+)\(", path.read_text(encoding="utf-8"), re.MULTILINE))
    assert SLOW_TESTS - defined == set()
    assert SLOW_FIXTURES - defined == set()
