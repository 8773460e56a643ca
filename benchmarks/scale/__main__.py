"""``python -m benchmarks.scale paired|tensors|profile|summary|worker ...`` (see :mod:`benchmarks.scale`)."""

import sys

from benchmarks.scale import main

sys.exit(main())
