"""What a bench run ran on (python, torch, the GPU), and the exit status of a run that cannot start here.

Its own module so that the timing run (cli) and the backward run (backward_run) both import it
without importing each other.
"""
from __future__ import annotations

import sys
from typing import Any

# no usable GPU (or torch, fla-core missing): 2, as every GPU tool of ptx-lab; 1 is a run whose
# every configuration failed
CANNOT_RUN_EXIT = 2


def environment() -> dict:
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        import torch
        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["device"] = p.name
            env["sms"] = p.multi_processor_count
            env["l2_bytes"] = getattr(p, "L2_cache_size", None)
            env["memory_bytes"] = p.total_memory
    except ImportError:
        env["torch"] = None
    return env
