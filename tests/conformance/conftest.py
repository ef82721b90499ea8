"""Prints how many conformance cases ran and passed, per suite, at the end of the session."""

from __future__ import annotations

import pytest

_RESULTS: dict[str, list[int]] = {}  # suite -> [ran, passed]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec else None
    if case is None or not hasattr(case, "suite") or report.when != "call":
        return
    counts = _RESULTS.setdefault(case.suite, [0, 0])
    counts[0] += 1
    counts[1] += report.passed


def pytest_terminal_summary(terminalreporter):
    if _RESULTS:
        parts = [f"{suite}: {passed}/{ran} passed" for suite, (ran, passed) in _RESULTS.items()]
        terminalreporter.write_line("EventBridge conformance cases — " + "; ".join(parts))
