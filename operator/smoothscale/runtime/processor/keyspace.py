"""Where each piece of a processor's state lives in its task's store: the state keys.

Everything a StatefulProcessor keeps for a task is state keys of the task's store, so the
changelog carries it like any other state (one data or delete record per key changed in a
batch, the newest record per key being the key's value: compaction-safe), and a hand-over
moves all of it at once. Keys are ASCII text; a name or a grouping key is written as JSON,
which ends where it ends (a string at its closing quote, a list at its closing bracket), so no
key is a prefix of another's range by accident and a range read by prefix is exact:

| state key | value | what |
| --- | --- | --- |
| `v<name><key>` | `{"v": value, "x": deadline}` | a value state of a grouping key |
| `l<name><key>` | `[[value, deadline], ...]` | a list state of a grouping key |
| `m<name><key><user key>` | `{"v": value, "x": deadline}` | one entry of a map state |
| `k<key><time>` | `1` | a timer, by grouping key (listTimers, deleteTimer) |
| `t<time><key>` | `1` | the same timer, by time (firing in order) |
| `x<time><state key>` | `1` | a TTL deadline of a value, list or map entry (eviction in order) |
| `w` | `{"processingTime", "maxEventTime", "watermark"}` | the task's clocks |

`<name>` is the state variable's name, `<key>` the grouping key and `<user key>` a map key,
each as JSON of its Spark type (codec); `<time>` is a signed millisecond timestamp as 16 hex
digits of its offset from -2^63, so the text order is the time order. A deadline (`"x"`, or
the second item of a list element) is absent or null without TTL.
"""

import json
from typing import Any

VALUE = "v"
LIST = "l"
MAP = "m"
TIMER_BY_KEY = "k"
TIMER_BY_TIME = "t"
DEADLINE = "x"
CLOCKS = "w"

_TIME_DIGITS = 16
_TIME_OFFSET = 1 << 63


def text(value: Any) -> str:
    """A name, grouping key or map key as the JSON text keys embed."""
    return json.dumps(value, separators=(",", ":"))


def time_text(milliseconds: int) -> str:
    return f"{milliseconds + _TIME_OFFSET:0{_TIME_DIGITS}x}"


def time_of(text_: str) -> int:
    return int(text_[:_TIME_DIGITS], 16) - _TIME_OFFSET


def variable(kind: str, name: str, key: str) -> str:
    """The key of a value or list state, or the prefix of a map state's entries."""
    return kind + text(name) + key


def variable_prefix(kind: str, name: str) -> str:
    """The prefix of every key of a state variable, all grouping keys together."""
    return kind + text(name)


def map_entry(name: str, key: str, user_key: str) -> str:
    return variable(MAP, name, key) + user_key


def timer_by_key(key: str, expiry: int) -> str:
    return TIMER_BY_KEY + key + time_text(expiry)


def timer_by_time(expiry: int, key: str) -> str:
    return TIMER_BY_TIME + time_text(expiry) + key


def deadline(expiry: int, state_key: str) -> str:
    return DEADLINE + time_text(expiry) + state_key


def split_timed(state_key: str) -> tuple[int, str]:
    """(time, rest) of a `t...` timer or an `x...` deadline key."""
    body = state_key[1:]
    return time_of(body), body[_TIME_DIGITS:]
