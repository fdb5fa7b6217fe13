"""The mode a new file gets under the process umask, for files written through a temp file (mkstemp makes them
0600): photos, videos' side files, the report, bench results and the weights pins get what `open` would give."""

from __future__ import annotations

import os


def _current_umask() -> int:
    mask = os.umask(0)          # the only way to read it; set back at once (at import, before any thread)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def new_file_mode() -> int:
    """0o666 less the umask (0644 under the usual 022)."""
    return 0o666 & ~_UMASK
