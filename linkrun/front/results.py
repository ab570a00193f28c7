"""What every tool answers: a `ToolResult` (its text for the agent, its
structured value, its notes), and `nullable`, the one spelling of "a value
or null" in the tools' schemas. Below the tool layer's modules (tools.py,
background_tools.py, checks.py, server.py), so that they share it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolResult:
    text: str
    structured: dict[str, object] | None = None
    is_error: bool = False
    header: bool = False  # the text is a header line, then exactly a program's bytes
    # Each also in the text; for the clients that give the model the structured value alone.
    notes: list[str] = field(default_factory=list)
    links: list[dict[str, object]] = field(default_factory=list)  # resource_link blocks, for clients that take them

    def add_note(self, note: str) -> None:
        """A note of the server's: a last line of its own, or, after a header,
        at the header's end, so that the bytes below stay exactly the bytes."""
        self.notes.append(note)
        if self.header:
            first, newline, rest = self.text.partition("\n")
            self.text = f"{first} · {note}{newline}{rest}"
        else:
            self.text += "\n" + note

    def answer(self, version: str) -> dict[str, object]:
        """The `tools/call` result a client at protocol `version` reads (fields by revision)."""
        content: list[dict[str, object]] = [{"type": "text", "text": self.text}]
        value: dict[str, object] = {"content": content}
        if self.is_error:
            value["isError"] = True
        elif self.structured is not None and version >= "2025-06-18":
            value["structuredContent"] = self.structured
        if self.links and not self.is_error and version >= "2025-06-18":  # resource_link: 2025-06-18 on
            content += self.links
        return value


def nullable(kind: str, description: str = "") -> dict[str, object]:
    """A value of `kind` or null, spelt with anyOf: clients that read `type`
    as one string mishandle `["integer", "null"]`, and the Inspector's
    --strict warns on it."""
    schema: dict[str, object] = {"anyOf": [{"type": kind}, {"type": "null"}]}
    if description:
        schema["description"] = description
    return schema
