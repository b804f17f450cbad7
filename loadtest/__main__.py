"""`python -m loadtest ...`: see loadtest.cli."""

from loadtest.cli import main

raise SystemExit(main())
