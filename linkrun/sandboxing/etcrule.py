"""What of the host's /etc a view copies (etcview.py): what is public on
the host, and no private key, by a rule that holds for layouts not seen
rather than by a list of known private folders.

1. A folder is copied when everyone on the host may list and enter it
   (o+r and o+x). One kept from the others is left out with all it holds:
   Debian's ssl/private (0710), RHEL's and Fedora's pki/CA/private (0700),
   pki/libvirt/private (0750).
2. A file is copied when everyone may read it (o+r); not one its owner or
   group alone may read, as the subscription's pki/entitlement/*-key.pem
   and pki/consumer/key.pem (0640).
3. A file everyone may read is still left out when it holds a PEM private
   key (`-----BEGIN ... PRIVATE KEY-----` of any kind: PKCS#8, RSA, EC,
   OpenSSH, encrypted, PGP's key block): a key made readable by mistake,
   or a certificate bundled with its key.
4. A link is kept as a link: it shows nothing itself, and one to a file
   left out points at nothing inside.

Why the others' bits: a view is copied by serve's user, its files are that
user's, and a program inside runs as that user. As root it would read every
file of the view, whatever its mode; as an ordinary user, whatever that
user may read. By the rule the view holds the same for both: what every
user of the host may read already, trust stores and public certificates.

RULE names the rule in a view's print: a view made by another rule is
made again, so none made before it keeps a private key.

stdlib only (and kernel.write_all): serve and the supervisor import it.
"""

from __future__ import annotations

import os
import re
import stat

from ..kernel import write_all

RULE = "rule 2: others may read, no PEM private key"
PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----")
CHUNK = 1 << 20
_OVERLAP = 80  # bytes of one read searched again with the next: a marker cut between them is found


def shown(info: os.stat_result | None) -> bool:
    """Whether the rule copies an entry (its lstat; None: a link, seen through its folder)."""
    if info is None or stat.S_ISLNK(info.st_mode):
        return True
    if stat.S_ISDIR(info.st_mode):
        return info.st_mode & 0o005 == 0o005
    return stat.S_ISREG(info.st_mode) and bool(info.st_mode & 0o004)


def copy_file(source: str, target: str, info: os.stat_result) -> bool:
    """Copy the file `source` to the new file `target` with its mode and
    times; False, and nothing left at `target`, when it holds a PEM private
    key. Never follows a link."""
    into = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            public = _copy_unless_private(into, out)
            if public:
                os.fchmod(out, stat.S_IMODE(info.st_mode))
                os.utime(out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(out)
    finally:
        os.close(into)
    if not public:
        os.unlink(target)
    return public


def _copy_unless_private(into: int, out: int) -> bool:
    before = b""
    while chunk := os.read(into, CHUNK):
        if PRIVATE_KEY.search(before + chunk):
            return False
        write_all(out, chunk)
        before = chunk[-_OVERLAP:]
    return True
