"""The public surface of regency.shape: exported names, docs, and no dependencies."""

import doctest
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import regency.shape

pytestmark = pytest.mark.timeout(30)

EXPORTED = ["DimensionNotFoundError", "Extent", "Point", "Selection", "Shape", "Slice"]


def test_exported_names_are_pinned() -> None:
    assert sorted(regency.shape.__all__) == EXPORTED
    public = sorted(n for n in dir(regency.shape) if not n.startswith("_"))
    assert public == EXPORTED


@pytest.mark.parametrize("name", EXPORTED)
def test_exported_classes_claim_the_public_module(name: str) -> None:
    cls = getattr(regency.shape, name)
    assert cls.__module__ == "regency.shape"
    assert f"regency.shape.{name}" in repr(cls)


@pytest.mark.parametrize("name", EXPORTED)
def test_every_public_name_is_documented(name: str) -> None:
    cls = getattr(regency.shape, name)
    assert inspect.getdoc(cls)
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        assert inspect.getdoc(value), f"{name}.{attr} has no docstring"


def test_docstring_examples_run() -> None:
    # The classes claim regency.shape as their module, so doctest finds them all there.
    globs = {name: getattr(regency.shape, name) for name in EXPORTED}
    result = doctest.testmod(regency.shape, globs=globs)
    assert result.failed == 0
    assert result.attempted >= 10


def test_docs_page_examples_run() -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "shape.md"
    result = doctest.testfile(str(page), module_relative=False)
    assert result.failed == 0
    assert result.attempted >= 15


def test_imports_nothing_outside_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import regency.shape; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    ).stdout.split()
    third_party = {m.split(".")[0] for m in out if m.split(".")[0] not in sys.stdlib_module_names}
    assert third_party == {"regency"}
