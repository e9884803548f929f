"""Topic names and regular-expression subscriptions, as Kafka and both pattern matchers take them.

A classic member's patterns are matched by librdkafka (POSIX extended regular expressions), a
KIP-848 member's by the broker (RE2/J): a pattern is accepted only where the two, and Python's
`re` that checks it, read it the same way.
"""

from __future__ import annotations

import re

from weir._ids import shown, text_problem

__all__ = ["topic_name_problem", "topic_problem"]

_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
# librdkafka matches a classic subscription's patterns with POSIX extended regular expressions
# (libc's regcomp), the broker matches KIP-848 ones with RE2/J: what Python's `re` accepts beyond
# their common part is refused rather than matched differently (`\d` is a plain `d` in POSIX).
_UNESCAPED = r"(?<!\\)(?:\\\\)*"  # after an even run of backslashes: not itself escaped
_NOT_PORTABLE = (
    (
        re.compile(_UNESCAPED + r"\(\?"),
        "'(?...)' groups (flags, lookaround, named or non-capturing groups)",
    ),
    (
        re.compile(_UNESCAPED + r"\\[A-Za-z0-9]"),
        "backslash classes and references such as \\d, \\w, \\b, \\1",
    ),
)


# A pattern ending in an unescaped `.*` or `$` matches the same topics whether the match must
# cover the whole name (the broker) or only start at its beginning (librdkafka's regexec).
_WHOLE_NAME = re.compile(_UNESCAPED + r"(?:\.\*|\$)$")


# A counted repetition: RE2 (the broker's matcher under KIP-848) refuses a count above 1000,
# glibc's regcomp (librdkafka's) one above 32767, and Python's `re` takes far larger ones. A '{'
# that starts no count is a literal to Python (and to RE2 as `{,n}`), an error to regcomp.
_BRACKETS = re.compile(_UNESCAPED + r"(\[\^?\]?(?:\[:[a-z]+:\]|[^\]])*\])")  # a '{' in one is a '{'
_BRACE = re.compile(_UNESCAPED + r"\{")
_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_MAX_REPEAT = 1000


def _count_problem(quoted: str, pattern: str) -> str | None:
    outside = _BRACKETS.sub(lambda m: m.group()[: m.start(1) - m.start()] + "_", pattern)
    for brace in _BRACE.finditer(outside):
        count = _COUNT.match(outside, brace.end() - 1)
        if count is None:
            return (
                f"{quoted} has a '{{' that starts no count {{m}}, {{m,}} or {{m,n}}, which the "
                "matchers read differently (librdkafka's POSIX regex refuses it or reads {,n} as "
                "{0,n}, RE2/J takes a literal): write \\{ for a brace"
            )
        if any(len(n.lstrip("0")) > 4 or int(n) > _MAX_REPEAT for n in count.groups() if n):
            return (
                f"{quoted} repeats {count.group()}: the broker's RE2/J refuses a count above "
                f"{_MAX_REPEAT} (librdkafka's POSIX regex one above 32767)"
            )
    return None


def topic_name_problem(name: str) -> str | None:
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        return f"{shown(name)} is not a topic name (1-249 of A-Z a-z 0-9 . _ -, not '.' or '..')"
    return None


def topic_problem(topic: str) -> str | None:
    if not topic.startswith("^"):
        problem = topic_name_problem(topic)
        if problem is not None:
            return f"{problem}; a regular expression subscription starts with '^'"
        return None
    quoted = shown(topic)
    problem = text_problem(quoted, topic)
    if problem is not None:
        return problem
    try:
        re.compile(topic)
    # Not only re.error: a count past sys.maxsize overflows, deep nesting recurses too far.
    except (re.error, ValueError, OverflowError, RecursionError) as exc:
        return f"{quoted} is not a valid regular expression: {exc}"
    for construct, what in _NOT_PORTABLE:
        if construct.search(topic):
            return (
                f"{quoted} uses {what}, which librdkafka's POSIX regex or the broker's RE2/J "
                "does not read the same way: use [0-9], [A-Za-z0-9_], ( | ) and escaped "
                "punctuation such as \\."
            )
    problem = _count_problem(quoted, topic)
    if problem is not None:
        return problem
    if not _WHOLE_NAME.search(topic):
        return (
            f"{quoted} must end with an unescaped '.*' or '$': under the classic protocol "
            "librdkafka takes a topic whose name starts with a match, under "
            "group_protocol='consumer' the broker only one whose whole name matches"
        )
    return None
