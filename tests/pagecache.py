"""Page-cache residency of files, measured with mmap + mincore(2) (Linux)."""
from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
PAGE = mmap.PAGESIZE


def resident_bytes(path: Path) -> tuple[int, int]:
    """-> (bytes of `path` in the page cache, file size), page granular."""
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    pages = (size + PAGE - 1) // PAGE
    with open(path, "rb") as f:
        # A private mapping is writable for ctypes but never written, so
        # every page mincore reports is the file's page-cache page.
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        try:
            anchor = ctypes.c_char.from_buffer(mm)
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.addressof(anchor), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            del anchor
        finally:
            mm.close()
    return sum(v & 1 for v in vec) * PAGE, size


def segment_residency(data_dir: Path) -> tuple[int, int]:
    """Resident and total bytes of every `.log` segment under data_dir."""
    resident = total = 0
    for p in Path(data_dir).rglob("*.log"):
        r, s = resident_bytes(p)
        resident += min(r, s)
        total += s
    return resident, total
