"""Garbage-collector settings for long-running processes that hold many objects.

CPython's cyclic collector runs a young collection every 700 net allocations and a full one
whenever the survivors have grown the old generation by a quarter. A server holding 10,000
hosts' long-polls, host tables and caches, or an emulator holding 10,000 simulated hosts, has
millions of objects: in benchmarks/placement.py full collections (0.2–0.8 s each) took about a
sixth of the server's CPU and two fifths of the emulator's. Objects are freed by reference
counting as they die; the collector only has reference cycles to find, and may look for them
far less often.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)


def tune() -> None:
    """Call once start-up has loaded what the process keeps: it is never garbage (frozen out of
    every collection), and collections run at THRESHOLDS from then on."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
