"""The one error type a config problem raises: it names the key path and the value."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration problem the user can act on.

    ``path`` is the dotted key path (``actor_train.device_mapping``); the message is one line.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)

    def __reduce__(self) -> tuple:
        # Ray (and pickle) rebuild an exception from its args: keep both, so an error raised inside a
        # worker reaches the driver as the same ConfigError.
        return (type(self), (self.path, self.message))


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to a mistyped key, or None when nothing is close."""
    pool = list(candidates)
    hits = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    if hits:
        return hits[0]
    # Keys that differ by a dropped/added underscore ("batchsize" vs "batch_size") score low
    # with difflib; compare them with underscores removed as a second chance.
    squashed = {c.replace("_", ""): c for c in pool}
    hits = difflib.get_close_matches(name.replace("_", ""), list(squashed), n=1, cutoff=0.75)
    return squashed[hits[0]] if hits else None


def join_path(*parts: str) -> str:
    return ".".join(p for p in parts if p)
