from __future__ import annotations

import pytest

from tests.k8s.rendered import Renders


@pytest.fixture(scope="session")
def renders() -> Renders:
    """Overlays rendered once per session, shared by every k8s test."""
    return Renders()
