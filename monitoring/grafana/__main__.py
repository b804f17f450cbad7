"""`python -m monitoring.grafana [--out DIR] [--check]`: regenerate the dashboards' JSON."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from monitoring.generated_files import generator_main
from monitoring.grafana.generate import DASHBOARDS_DIR, render_all


def main(argv: Sequence[str] | None = None) -> int:
    return generator_main(
        "python -m monitoring.grafana", __doc__, DASHBOARDS_DIR, render_all, "*.json", argv
    )


if __name__ == "__main__":
    sys.exit(main())
