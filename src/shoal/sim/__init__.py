"""Simulated fleets: thousands of hosts served by an in-process agent emulator that drives a
real control plane through the real agent protocol, with task run times from a model.

  model     TaskModel: start delay, run time (or forever), exit codes; seeded per task
  host      SimHost: a host's registration and the life of its tasks (no I/O)
  wire      a minimal keep-alive HTTP/1.1 client (one connection per poller)
  emulator  Emulator: registration, long-polls and reports for every host, in one event loop
  fleet     SimFleet and HostSpec: the Python API (async, or on a background thread)

The real agent never imports this package; this package reuses the agent's pure helpers
(registration body, catalog).
"""

from shoal.sim.fleet import HostSpec, SimFleet
from shoal.sim.model import Outcome, TaskModel

__all__ = ["HostSpec", "SimFleet", "TaskModel", "Outcome"]
