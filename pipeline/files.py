"""Writing files so that a reader never sees half of one: a temporary name beside the target, then a
rename. Every module that writes a cache, a run or a report writes through here.

    from pipeline import files
    files.atomic_write_text(path, text)
    files.atomic_write(path, lambda tmp: model.save_weights(str(tmp)), suffix=".weights.h5")
"""
import errno
import os
from pathlib import Path

from pipeline.errors import disk_full


def temporary(path, suffix=""):
    """The temporary name beside `path` that atomic writes use: `.NAME.tmpPID[suffix]`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")


def atomic_write(path, write, suffix=""):
    """The one atomic write: `write(tmp)` writes a temporary file beside `path` (named by
    `temporary`; `suffix` for writers that insist on one), which is then renamed to `path`, so
    readers never see half a file. On any failure the temporary file is removed; a full disk
    (ENOSPC) becomes one line naming `path` (pipeline.errors.DiskFull)."""
    path = Path(path)
    tmp = temporary(path, suffix)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise disk_full(path) from None
        raise


def atomic_write_bytes(path, data):
    """`data` to `path` atomically (and durably: fsync before the rename)."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    atomic_write(path, write)


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))
