"""``python -m benchmarks.scale [run|report|paired|tensors|profile|worker] ...`` (see :mod:`benchmarks.scale`)."""

import sys

from benchmarks.scale import main

sys.exit(main())
