"""ROLL's ``search`` tool (GEM's retrieval contract): the model writes ``<search>query</search>``, the query
is POSTed to ``search_url`` as a msgpack object ``{"query", "topk", "return_scores"}``, and the server's
msgpack answer ``{"result": [{"document": {"contents": "title\\ntext"}, ...}, ...]}`` comes back as
numbered passages inside ``<information>...</information>``.

An unreachable, slow or malformed server gives a tool error observation within ``timeout`` seconds; the
episode goes on. ``search_url`` falls back to the ``SEARCH_URL`` environment variable, as in GEM.
"""

from __future__ import annotations

import os
import re
import socket
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

PATTERN = re.compile(r"<search>(.*?)</search>", re.DOTALL)
INSTRUCTION = (
    "A search engine can look things up for you. When you need a fact you do not know, write the query "
    "between <search> and </search>; the passages it finds come back between <information> and "
    "</information>. Search as often as you need, then give the final answer between <answer> and </answer>."
)
MAX_QUERY_CHARS = 2048
MAX_REPLY_BYTES = 1 << 20


class SearchTool:
    tool_type = "search"

    def __init__(self, search_url: str | None = None, topk: int = 3, timeout: float = 5, num_workers: int = 1,
                 tool_instruction: str | None = None) -> None:
        self.search_url = search_url or os.environ.get("SEARCH_URL") or ""
        if not self.search_url:
            raise ValueError("search_url is not set (nor is SEARCH_URL): name the retrieval server's URL")
        parsed = urlparse(self.search_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"search_url {self.search_url!r} is not an http(s) URL")
        if int(topk) < 1 or not float(timeout) > 0:
            raise ValueError(f"topk must be >= 1 and timeout > 0, got topk={topk!r}, timeout={timeout!r}")
        self.topk, self.timeout = int(topk), float(timeout)
        self.instruction = tool_instruction or INSTRUCTION

    def instruction_string(self) -> str:
        return self.instruction

    def probe(self, wait_s: float = 2.0) -> str | None:
        """None when something accepts connections at ``search_url``'s host and port, else why not."""
        parsed = urlparse(self.search_url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname, port), timeout=wait_s):
                return None
        except OSError as e:
            return f"nothing answers at {parsed.hostname}:{port} ({e.strerror or type(e).__name__})"

    def search(self, query: str) -> tuple[bool, str]:
        """(ok, passages or the error) for one query."""
        import msgspec

        body = msgspec.msgpack.encode({"query": query[:MAX_QUERY_CHARS], "topk": self.topk, "return_scores": True})
        request = urllib.request.Request(self.search_url, data=body, method="POST",
                                         headers={"Content-Type": "application/msgpack"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as reply:
                payload = reply.read(MAX_REPLY_BYTES + 1)
            if len(payload) > MAX_REPLY_BYTES:
                return False, f"the search reply is larger than {MAX_REPLY_BYTES} bytes"
            result = msgspec.msgpack.decode(payload)["result"]
            return True, passages(result)
        except (OSError, urllib.error.URLError, msgspec.DecodeError, KeyError, TypeError, ValueError) as e:
            return False, f"search failed ({type(e).__name__}: {str(e)[:160]})"

    def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
        match = PATTERN.search(action)
        if match is None:
            return False, True, "", action
        ok, text = self.search(match.group(1).strip())
        return True, not ok, f"\n\n<information>{text}</information>\n\n", action[: match.end()]


def passages(result: Any) -> str:
    """Numbered passages ``Doc i(Title: t) text``, the title being a document's first line."""
    lines = []
    for i, item in enumerate(result, 1):
        contents = str(item["document"]["contents"])
        title, _, text = contents.partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines) + ("\n" if lines else "")
