"""The settings table in docs/local-stack.md lists exactly the settings the code reads."""

from __future__ import annotations

import re

from flow.config import ENV_VARS
from tests.support import REPO


def test_every_setting_is_documented_and_every_documented_setting_exists() -> None:
    text = (REPO / "docs" / "local-stack.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z0-9_]+)` \|", text, re.MULTILINE))
    assert documented == set(ENV_VARS)
