"""The one exception the pattern engine raises."""

from __future__ import annotations

PREFIX = "Event pattern is not valid. Reason: "


class InvalidEventPattern(Exception):
    """An event pattern that EventBridge would reject with InvalidEventPatternException.

    ``message`` is the full AWS-style text, ``"Event pattern is not valid. Reason: <reason>"``;
    ``reason`` is the part after the prefix. Where the recorded AWS responses give the reason
    (event-ruler's own wording), the text is the same.
    """

    def __init__(self, reason: str):
        self.reason = reason
        self.message = PREFIX + reason
        super().__init__(self.message)
