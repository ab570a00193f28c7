"""A call's conversation, from its `_meta`: what background commands and a
call's kept output belong to. Its own module, with nothing to load: a serve
without background commands reads it for every call it keeps the output of."""

from __future__ import annotations

from typing import Any

from ..errors import Refused

THREAD_KEY = "link.local/thread"
HOPS_KEY = "link.local/hops"
CLIENT_THREAD_KEY = "threadId"  # Codex's own thread, in every tools/call's _meta
DEFAULT_THREAD = "default"  # the conversation of a plain client that names none


def conversation(meta: dict[str, Any], way_in: bool) -> tuple[str, int]:
    """The call's conversation and its hops.

    With a way in, the seeds' rule: no `link.local/thread`, no background
    call. Without one (a plain MCP client, which cannot send it), a call that
    names none belongs to the client's own thread where the client names one
    (Codex sends `threadId`), else to the agent's one default conversation."""
    thread = meta.get(THREAD_KEY)
    if thread is None and not way_in:
        thread = _client_thread(meta) or DEFAULT_THREAD
    if not isinstance(thread, str) or not thread:
        raise Refused("background commands need the conversation",
                      f'the call\'s _meta must carry "{THREAD_KEY}" (a non-empty string); a harness that takes '
                      "messages sets it")
    hops = meta.get(HOPS_KEY, 0)
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 0:
        raise Refused(f'_meta "{HOPS_KEY}" must be a whole number of 0 or more', "leave it out for 0")
    return thread, hops


def _client_thread(meta: dict[str, Any]) -> str | None:
    thread = meta.get(CLIENT_THREAD_KEY)
    return thread if isinstance(thread, str) and thread else None
