"""EventBridge event patterns: validation, matching, and an index for matching many rules.

    compile_pattern(text_or_dict) -> Pattern       # raises InvalidEventPattern
    Pattern.matches(event) -> bool
    RuleIndex: add(rule_id, pattern), remove(rule_id), match(event) -> set of rule ids

The language and its corner cases are those of aws/event-ruler 2.x, which Amazon EventBridge
runs, including array-consistent matching; see docs in shared/reference/eventbridge-patterns.md.
"""

from __future__ import annotations

from shoal.events.patterns.compiler import compile_tree
from shoal.events.patterns.errors import InvalidEventPattern
from shoal.events.patterns.index import RuleIndex
from shoal.events.patterns.parse import from_python, load_text
from shoal.events.patterns.pattern import Pattern

__all__ = ["InvalidEventPattern", "Pattern", "RuleIndex", "compile_pattern"]


def compile_pattern(pattern: str | bytes | dict) -> Pattern:
    """Validate a pattern (JSON text or Python dict) and compile it once.

    JSON text is read with duplicate keys preserved, as AWS reads it: a repeated leaf path keeps
    its last value. Raises InvalidEventPattern with AWS's wording.
    """
    if isinstance(pattern, (str, bytes, bytearray)):
        tree = load_text(pattern)
    else:
        tree = from_python(pattern)
    return Pattern(compile_tree(tree))
