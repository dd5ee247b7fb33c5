"""``regency``'s lazy top-level tensor names stay in step with ``regency.tensor``."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_every_top_level_tensor_name_is_the_tensor_packages_object() -> None:
    import regency
    import regency.tensor

    for name in regency._TENSOR_NAMES:
        assert name in regency.tensor.__all__, name
        assert getattr(regency, name) is getattr(regency.tensor, name), name
    assert "inspect" in dir(regency)


def test_importing_regency_does_not_import_torch() -> None:
    code = "import sys, regency; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=False
    )
    assert done.returncode == 0, done.stderr
