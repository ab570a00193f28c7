"""Head-and-tail capture of a stream, and UTF-8 cuts that never split a character."""

from __future__ import annotations


class Capture:
    """Keeps the first and last halves of `limit` bytes, and counts them all."""

    __slots__ = ("head", "tail", "total", "_head_room", "_tail_size")

    def __init__(self, limit: int):
        self._head_room = limit // 2
        self._tail_size = limit - limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: memoryview) -> None:
        self.total += len(chunk)
        room = self._head_room - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._keep_tail(chunk)

    @property
    def head_full(self) -> bool:
        return len(self.head) >= self._head_room

    @property
    def tail_size(self) -> int:
        return self._tail_size

    def skip(self, count: int, last: bytes) -> None:
        """`count` bytes went by with the head full; `last` are their final bytes."""
        self.total += count
        self._keep_tail(last)

    def _keep_tail(self, data) -> None:
        """The last tail-size bytes of what was kept so far followed by `data`."""
        if len(data) >= self._tail_size:
            self.tail[:] = data[len(data) - self._tail_size:]
        else:
            self.tail += data
            excess = len(self.tail) - self._tail_size
            if excess > 0:
                del self.tail[:excess]

    @property
    def left_out(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def texts(self) -> tuple[str, str]:
        """(head, tail) as text; a character cut at a boundary is dropped, not mangled."""
        if self.left_out == 0:
            return decode(bytes(self.head + self.tail)), ""
        return decode(utf8_head(self.head)), decode(utf8_tail(self.tail))


def decode(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


def utf8_head(data: bytes | bytearray) -> bytes:
    """`data` without a UTF-8 character cut off at its end."""
    end = len(data)
    # Walk back over at most 3 continuation bytes to the lead byte.
    index = end - 1
    while index >= 0 and end - index <= 3 and 0x80 <= data[index] < 0xC0:
        index -= 1
    if index >= 0:
        lead = data[index]
        need = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if 0xF0 <= lead < 0xF8 else 1
        if need > end - index:
            return bytes(data[:index])
    return bytes(data)


def utf8_tail(data: bytes | bytearray) -> bytes:
    """`data` without the continuation bytes of a character cut at its start."""
    start = 0
    while start < len(data) and start < 3 and 0x80 <= data[start] < 0xC0:
        start += 1
    return bytes(data[start:])
