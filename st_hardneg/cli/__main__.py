"""``python -m st_hardneg.cli``: the ``st-hardneg`` command."""

from st_hardneg.cli.app import main

raise SystemExit(main())
