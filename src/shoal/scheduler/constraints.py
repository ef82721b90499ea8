"""memberOf over many hosts at once: a parsed cluster-query expression evaluated against the
engine's columns, giving one boolean per candidate host.

A comparison is decided once per distinct value of its subject (an attribute has a handful of
values across thousands of hosts), then mapped back to the hosts through the value codes. The
semantics are those of `shoal.domain.query` (any value satisfies the positive operator; the
negative operators negate the whole), and the property tests check the two agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shoal.domain import query
from shoal.scheduler.hosts import AGENT_VERSION, EC2_INSTANCE_ID

if TYPE_CHECKING:
    from shoal.scheduler.engine import HostTable

# Subjects that change only when a host's row changes, not as tasks are placed.
STATIC_SUBJECTS = {"agentConnected", "agentVersion", "ec2InstanceId", "registeredAt"}


def is_static(expr: query.Expr) -> bool:
    return all(s in STATIC_SUBJECTS or s.startswith("attribute:") for s in expr.subjects())


def evaluate(expr: query.Expr, table: "HostTable", cand: np.ndarray) -> np.ndarray:
    if isinstance(expr, query.And):
        ok = np.ones(len(cand), bool)
        for operand in expr.operands:
            ok &= evaluate(operand, table, cand)
        return ok
    if isinstance(expr, query.Or):
        ok = np.zeros(len(cand), bool)
        for operand in expr.operands:
            ok |= evaluate(operand, table, cand)
        return ok
    positive = _positive(expr, table, cand)
    return ~positive if expr.negated else positive


def _positive(c: query.Comparison, table: "HostTable", cand: np.ndarray) -> np.ndarray:
    """Whether any of each host's values satisfies the operator's positive form."""
    exists = c.operator in ("exists", "!exists")
    subject = c.subject
    if subject.startswith("attribute:") or subject in ("agentVersion", "ec2InstanceId"):
        name = {"agentVersion": AGENT_VERSION, "ec2InstanceId": EC2_INSTANCE_ID}.get(subject) \
            or subject[len("attribute:"):]
        column = table._column(name)
        codes = column.codes[cand]
        if exists:
            return codes >= 0
        # One verdict per distinct value; the extra last entry answers for hosts without one.
        verdicts = np.array([v is not None and bool(c.test(v)) for v in column.values] + [False], bool)
        return verdicts[codes]  # code -1 reads the last entry
    if subject == "agentConnected":
        values = table.connected[cand]
        return np.ones(len(cand), bool) if exists else np.where(values, c.test(True), c.test(False))
    if subject in ("runningTasksCount", "registeredAt"):
        values = table.running[cand] if subject == "runningTasksCount" else table.registered_at[cand]
        if exists:
            return np.ones(len(cand), bool)
        unique, inverse = np.unique(values, return_inverse=True)
        convert = int if subject == "runningTasksCount" else float
        return np.array([bool(c.test(convert(u))) for u in unique], bool)[inverse] if len(unique) else \
            np.zeros(0, bool)
    if subject == "task:group":
        ok = np.zeros(len(cand), bool)
        for group, counts in table.groups.items():
            if exists or c.test(group):
                ok |= counts[cand] > 0
        return ok
    raise AssertionError(f"unknown subject {subject!r}")  # the parser admits no other
