"""`python -m ptx_lab` is the `ptx-lab` command."""
from .cli import main

raise SystemExit(main())
