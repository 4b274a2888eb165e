"""The handoff's Python interface answers to the names docs/handoff.md uses."""

from __future__ import annotations

import subprocess
import sys

import flow.handoff
from flow.handoff.convert import Conversion, convert
from tests.support import REPO


def test_convert_is_reached_as_the_docs_spell_it() -> None:
    assert (
        "flow.handoff.convert(df).dataloader(batch_size=4096)"
        in (REPO / "docs" / "handoff.md").read_text()
    )
    assert flow.handoff.convert is convert
    assert flow.handoff.Conversion is Conversion
    assert {"convert", "Conversion"} <= set(flow.handoff.__all__)


def test_the_function_keeps_its_name_whatever_is_imported_first() -> None:
    # The function shares its submodule's name: importing the submodule first, as older code
    # does, must not leave `flow.handoff.convert` a module.
    code = (
        "from flow.handoff.convert import convert\n"
        "import flow.handoff, sys\n"
        "assert flow.handoff.convert is convert, flow.handoff.convert\n"
        "assert 'pyspark' not in sys.modules and 'torch' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
