"""EventBridge event patterns: validation, matching, and an index for matching many rules.

    compile_pattern(text_or_dict) -> Pattern       # raises InvalidEventPattern
    Pattern.matches(event) -> bool
    RuleIndex: add(rule_id, pattern), remove(rule_id), match(event) -> set of rule ids

The language and its corner cases are those of aws/event-ruler 2.x, which Amazon EventBridge
runs, including array-consistent matching; see docs in shared/reference/eventbridge-patterns.md.
"""

from __future__ import annotations

from shoal.events.patterns.errors import InvalidEventPattern
from shoal.events.patterns.index import RuleIndex
from shoal.events.patterns.pattern import Pattern, compile_pattern

__all__ = ["InvalidEventPattern", "Pattern", "RuleIndex", "compile_pattern"]
