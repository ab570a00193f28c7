"""A call's arguments checked before anything runs: `command`'s and `start`'s
into a resolved Request, and what execve could never take refused, naming
the limit. A refusal quotes a long value cut short.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..calls.setup import PUT_IT_IN_INPUT as _PUT_IT_IN_INPUT, exec_size as _size
from ..errors import Refused
from ..processes.runner import Request

# What Linux's execve passes: one argument of at most MAX_ARG_STRLEN bytes, its
# NUL included, and all of them with the environment within ARG_MAX (each
# string's bytes, its NUL and its pointer: the launch's whole argv is checked
# by the owner of calls, calls/setup.py:check_exec_size).
ARG_STRLEN_MAX = 128 * 1024 - 1
PATH_MAX = 4095  # a path's bytes, its NUL excluded
NAME_MAX = 255  # one name of a path
QUOTE_MAX = 80  # a refusal quotes a longer value cut to its start
QUOTE_KEPT = 60


def quoted(value: str) -> str:
    """A value as a refusal quotes it: whole when short, else its start, cut
    with … and its length (a 10 MB program name made a 10 MB answer)."""
    if len(value) <= QUOTE_MAX:
        return repr(value)
    return f"{value[:QUOTE_KEPT]!r}… ({len(value)} characters)"


def cut_values(text: str, arguments: Mapping[str, object]) -> str:
    """`text` with each long string argument it quotes cut, however it was quoted."""
    for value in arguments.values():
        if isinstance(value, str) and len(value) > QUOTE_MAX and value in text:
            text = text.replace(repr(value), quoted(value)).replace(value, quoted(value))
    return text


def check_run(arguments: Mapping[str, object], resolve: Callable[[str], str], longest: int, files: str) -> Request:
    """The checks `command` and `start` share: arguments → a resolved Request;
    `resolve`: the program's host path (programs.Programs.resolve, Refused when
    it is not allowed); `longest`: serve's --timeout, the default and the most;
    `files`: the files folder, which an absolute folder may name itself by."""
    program = arguments.get("program")
    if program is None:
        raise Refused("program is missing", "give the program to run: a bare name such as python3, or an absolute path")
    if not isinstance(program, str):
        raise Refused("program must be a string", "give a bare name such as python3, or an absolute path")
    _check_path_size("program", program)
    args = arguments.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise Refused("args must be an array of strings", 'such as ["-c", "print(1)"]')
    if any("\0" in a for a in args):
        raise Refused("an argument holds a NUL byte", "arguments are passed to the program as C strings")
    for number, arg in enumerate(args, 1):
        if len(arg) > ARG_STRLEN_MAX // 4 and _size(arg) > ARG_STRLEN_MAX:
            raise Refused(f"argument {number} is {_size(arg)} bytes, and Linux passes at most "
                          f"{ARG_STRLEN_MAX} bytes in one argument (MAX_ARG_STRLEN)", _PUT_IT_IN_INPUT)
    text = arguments.get("input")
    if text is not None and not isinstance(text, str):
        raise Refused("input must be a string", "it is the text the program reads on its input")
    folder = arguments.get("folder", "")
    if not isinstance(folder, str):
        raise Refused("folder must be a string", "give a folder of the files folder, such as work")
    folder = _check_folder(folder, files)
    timeout = arguments.get("timeout", longest)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= longest:
        raise Refused(f"timeout must be a number of seconds above 0 and at most {longest}",
                      "leave it out for the longest")
    path = resolve(program)
    return Request(path, tuple(args), text.encode() if text else None, folder, float(timeout))


def _check_path_size(what: str, path: str) -> None:
    """A path Linux could never open is refused here, quoted cut short."""
    if len(path) > PATH_MAX // 4 and _size(path) > PATH_MAX:
        raise Refused(f"{what} {quoted(path)} is longer than a path may be ({PATH_MAX} bytes)", f"give a shorter {what}")
    for name in path.split("/"):
        if len(name) > NAME_MAX // 4 and _size(name) > NAME_MAX:
            raise Refused(f"{what} {quoted(path)} holds a name longer than a name may be ({NAME_MAX} bytes)",
                          f"give a shorter {what}")


def _check_folder(folder: str, files: str) -> str:
    """The folder relative to the files folder. An absolute one inside it (as `pwd` prints it there, and as
    the instructions name the files folder) is taken as the same folder relative to it."""
    _check_path_size("folder", folder)
    if folder.startswith("/"):
        files = files.rstrip("/")
        if folder != files and not folder.startswith(files + "/"):
            raise Refused(f"folder {folder!r} is outside the files folder ({files})",
                          "give a folder inside it, relative to it, such as work")
        folder = folder[len(files):].strip("/")
    if "\0" in folder:
        raise Refused("folder holds a NUL byte", "give a folder relative to the files folder, such as work")
    if ".." in folder.split("/"):
        raise Refused(f"folder {folder!r} goes up with '..'", "give a folder inside the files folder, such as work")
    return folder
