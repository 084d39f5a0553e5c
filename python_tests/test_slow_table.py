"""The default run's opt-out table names tests that exist, each with the sibling that still covers it."""
from __future__ import annotations

import os
import re

from conftest import ROOT, SLOW_IN_DEFAULT_RUN


def test_every_entry_names_a_test_in_its_file_and_a_sibling():
    for node, sibling in SLOW_IN_DEFAULT_RUN.items():
        path, name = node.split("::", 1)
        with open(os.path.join(ROOT, path)) as handle:
            text = handle.read()
        function = name.split("[")[0].split(".")[-1]
        assert re.search(rf"(def|class) {re.escape(function)}\b", text), node
        assert isinstance(sibling, str) and sibling, node
