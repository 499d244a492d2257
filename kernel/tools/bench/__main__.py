"""`python -m kernel.tools.bench` is `ptx-lab bench`."""
import sys

from .cli import main

sys.exit(main())
