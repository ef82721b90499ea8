"""Per-host version counters that wake agents' long-polls.

Every committed change an agent must act on (a task placed on its host, a stop asked for, the
host drained or deregistered) bumps its host's counter, and the long-poll waiting on that host
returns at once. The counter lives in this process: a poll token is `<boot>.<n>`, so a token
from before a server restart never matches and the agent simply gets the current state. (With
several servers on one PostgreSQL, a change committed by another server reaches the agent at its
next poll; see docs/decisions.md.)
"""

from __future__ import annotations

import asyncio
import secrets


class HostSignals:
    def __init__(self) -> None:
        self.boot = secrets.token_hex(4)
        self.closing = False
        self._versions: dict[str, int] = {}
        self._waiters: dict[str, set[asyncio.Future]] = {}

    def token(self, host_arn: str) -> str:
        return f"{self.boot}.{self._versions.get(host_arn, 0)}"

    def bump(self, host_arns) -> None:
        """Called on the event loop once the change has committed."""
        for arn in host_arns:
            self._versions[arn] = self._versions.get(arn, 0) + 1
            for waiter in self._waiters.pop(arn, ()):
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(self, host_arn: str, since: str | None, timeout: float) -> bool:
        """Return when the host's token differs from `since`, or after `timeout` seconds; True if
        a change came while waiting (not one that was there already, nor a timeout)."""
        if since != self.token(host_arn) or self.closing:
            return False
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(host_arn, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
            return not self.closing
        except asyncio.TimeoutError:
            return False
        finally:
            waiting = self._waiters.get(host_arn)
            if waiting is not None:
                waiting.discard(waiter)
                if not waiting:
                    del self._waiters[host_arn]

    def close(self) -> None:
        """The server is shutting down: every long-poll answers now, and any new one at once,
        rather than being cancelled when the grace period ends (the agent, answered, simply
        polls again, and finds the next server)."""
        self.closing = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
