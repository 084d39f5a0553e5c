"""TVM v0.19's own tests of recast, count_layers and LayoutConfig, run against the package's functions.

The tests are read at test time from a TVM source archive (never copied into
this repository): ``$TVM_SOURCE_TARBALL``, else ``../shared/tvm-cuda/`` next to
the repository, else ``/work/shared/tvm-cuda/``. TVM's functions are replaced
by the package's with ``numbering="tvm"`` bound, and each test module is
loaded after the replacement, so its ``from tvm... import recast`` binds the
package's function. A counter on each replacement shows it was the one called.
"""
import ast
import functools
import importlib.util
import os
import tarfile
from pathlib import Path

import pytest
import tvm
from tvm import relay

import tvm_tcutils

ARCHIVE_NAME = "tvm-v0.19.0-src.tar.xz"
REPO = Path(__file__).resolve().parents[2]
CANDIDATES = (REPO.parent / "shared" / "tvm-cuda" / ARCHIVE_NAME, Path("/work/shared/tvm-cuda") / ARCHIVE_NAME)

#: TVM test file -> (where TVM keeps the function, its name, the package's function,
#: whether every test of the file is one of it, else only those that name it).
SUITES = {
    "tests/python/relay/test_recast.py": (relay.transform, "recast", tvm_tcutils.recast, True),
    "tests/python/relay/test_layer_count.py": (relay.analysis, "count_layers", tvm_tcutils.count_layers, True),
    "tests/python/relay/test_pass_convert_op_layout.py": (
        relay.transform, "LayoutConfig", tvm_tcutils.LayoutConfig, False,
    ),
}


def _archive() -> Path:
    chosen = os.environ.get("TVM_SOURCE_TARBALL")
    if chosen:
        if not Path(chosen).is_file():
            pytest.fail(f"TVM_SOURCE_TARBALL={chosen} is not a file")
        return Path(chosen)
    for candidate in CANDIDATES:
        if candidate.is_file():
            return candidate
    pytest.skip(f"no TVM source archive: set TVM_SOURCE_TARBALL or put {ARCHIVE_NAME} in {CANDIDATES[0].parent}")


@pytest.fixture(scope="module")
def tvm_tests(tmp_path_factory) -> dict:
    """TVM's test files of :data:`SUITES`, extracted from the archive: {suffix: path}."""
    archive = _archive()
    target, found = tmp_path_factory.mktemp("tvm_tests"), {}
    # One pass over the compressed stream; only the few members wanted are written.
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            suffix = next((s for s in SUITES if member.isfile() and member.name.endswith("/" + s)), None)
            if suffix is not None and suffix not in found:
                path = target / Path(suffix).name
                path.write_bytes(tar.extractfile(member).read())
                found[suffix] = path
    missing = sorted(set(SUITES) - set(found))
    if missing:
        pytest.skip(
            f"{archive} has no {', '.join(missing)} (a release archive without tests/?); point "
            "TVM_SOURCE_TARBALL at a TVM v0.19.0 source archive with its tests, e.g. GitHub's v0.19.0.tar.gz"
        )
    return found


class Counted:
    """A callable that counts its calls."""

    def __init__(self, function):
        self.function = function
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


def _test_names(path: Path, name: str, every_test: bool) -> list:
    """The test functions of a TVM test file to run: all, or those that use ``name``."""
    tree = ast.parse(path.read_text())
    tests = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    uses = lambda node: any(isinstance(n, (ast.Name, ast.Attribute)) and name in (getattr(n, "id", None), getattr(n, "attr", None)) for n in ast.walk(node))  # noqa: E731
    return [node.name for node in tests if every_test or uses(node)]


@pytest.mark.parametrize("suffix", list(SUITES), ids=[Path(s).stem for s in SUITES])
def test_tvm_tests_pass_with_the_package_functions(suffix, tvm_tests, monkeypatch):
    home, name, ours, every_test = SUITES[suffix]
    counted = Counted(functools.partial(ours, numbering="tvm"))
    monkeypatch.setattr(home, name, counted)
    assert getattr(home, name) is counted
    path = tvm_tests[suffix]
    spec = importlib.util.spec_from_file_location(f"tvm_own_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # after the patch: its imports bind the package's function

    names = _test_names(path, name, every_test)
    assert names, f"{suffix} has no test of {name}"
    failures = {}
    for test_name in names:
        with tvm.transform.PassContext():  # each test starts from a clean context, as under pytest
            try:
                getattr(module, test_name)()
            except AssertionError as err:
                failures[test_name] = f"AssertionError: {str(err)[:300]}"
            except (ValueError, TypeError, tvm.TVMError) as err:
                failures[test_name] = f"{type(err).__name__}: {str(err)[:300]}"
    assert not failures, f"TVM's tests that fail with the package's {name}: {failures}"
    # Not vacuous: every test ran through the package's function.
    assert counted.calls >= len(names), (counted.calls, names)
