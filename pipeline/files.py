"""Writing files so that a reader never sees half of one: a temporary name beside the target, then a
rename. Every module that writes a cache, a run or a report writes through here.

    from pipeline import files
    files.atomic_write_text(path, text)
    files.check_folder(args.out, "--out")            # before any work: not a file, writable
    files.atomic_write(path, lambda tmp: model.save_weights(str(tmp)), suffix=".weights.h5")
    with files.exclusive(folder / ".job.lock", lambda holder: f"... ({holder} holds it)"):  # one run at a time
        ...
"""
import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

from pipeline.errors import PipelineError, disk_full


def check_folder(path, flag="--out"):
    """Before any work: PipelineError naming `flag` unless `path` is a folder, or can be made one, that
    this process may write (not a file, not under a file)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise PipelineError(f"{flag} {path}: a file, not a folder")
    check_writable(path, flag, path)


def check_given(path, flag, give):
    """PipelineError naming `flag` when `path` is empty or blank (`--out "$DIR"` with DIR unset): one
    line ending "give {give}", never read as no option (a command's default folder). None passes."""
    if path is not None and not str(path).strip():
        raise PipelineError(f"{flag}: an empty path; give {give}")


def followed(path, flag="--out"):
    """`path`, or where it leads when it is a symbolic link (written through, as a shell's `>` writes: a
    link to a folder not made yet has it made there); PipelineError naming `flag` for a link that leads
    back to itself, which no folder can be made at."""
    path = Path(path)
    if not path.is_symlink():
        return path
    real = Path(os.path.realpath(path))
    if real.is_symlink():
        raise PipelineError(f"{flag} {path}: a symbolic link that leads back to itself; give a folder")
    return real


def check_writable(path, flag, folder):
    """PipelineError naming `flag` and `path` unless `folder`, or the nearest of its parents that exists
    (the rest is made when written), is a folder this process may write: its permissions allow it and
    a file can be made there (tried, then removed: root passes every permission check, and a read-only
    or virtual file system such as /proc takes no new file)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise PipelineError(f"{flag} {path}: {folder} is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PipelineError(f"{flag} {path}: {folder} is not writable")
    probe = folder / f".{Path(path).name}.probe{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as e:
        raise PipelineError(f"{flag} {path}: cannot write in {folder} ({e.strerror or e})") from None
    os.unlink(probe)


def check_not_input(path, flag, inputs):
    """Before any work: PipelineError naming `flag` when `path` is one of the command's `inputs`
    ({option: path or None}), through a link or a second name too, or lies inside one that is a folder:
    the command would write its output over what it reads (`speak --out VOICE/export.json`)."""
    out = Path(os.path.realpath(path))
    for option, given in inputs.items():
        if not given or not os.path.exists(given):
            continue
        source = Path(os.path.realpath(given))
        same = out.exists() and os.path.samefile(out, source)
        if same or (source.is_dir() and source in out.parents):
            where = "is that file" if same else "lies in that folder"
            raise PipelineError(f"{flag} {path}: it {where}, {option} {given}, which this command reads; "
                                "write the output elsewhere")


def target(path, flag=None):
    """Where an atomic write of `path` lands: a symbolic link's target (the link stays a link, as with a
    shell's `>`), else `path` itself. PipelineError (naming `flag` when given) when that is something a
    rename must not replace: a folder, a device, a pipe or a socket (run as root, `--out /dev/null`
    would otherwise become a regular file, and every later writer to it would fill the disk)."""
    path = Path(path)
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    if real.exists() and not real.is_file():  # exists() and is_file() follow links
        what = "a folder" if real.is_dir() else "not a regular file (a device, a pipe or a socket)"
        where = "" if real == path else f" (where the link leads: {real})"
        raise PipelineError(f"{f'{flag} ' if flag else ''}{path}: {what}{where}; give the path of a file to write")
    return real


def temporary(path, suffix=""):
    """The temporary name beside `path` that atomic writes use: `.NAME.tmpPID[suffix]`."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}{suffix}")


def atomic_write(path, write, suffix=""):
    """The one atomic write: `write(tmp)` writes a temporary file beside `path` (named by
    `temporary`; `suffix` for writers that insist on one), which is then renamed to `path`, so
    readers never see half a file; the file is synced to disk before the rename, so a crash leaves
    the old file or the whole new one, never an empty one. On any failure the temporary file is removed; a full disk
    (ENOSPC) becomes one line naming `path` (pipeline.errors.DiskFull). A symbolic link is written
    through (its target replaced); a folder, device, pipe or socket is refused (`target`)."""
    path = target(path)
    tmp, claimed = temporary(path, suffix), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        claimed = claim(tmp, path)
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)  # durable before the rename: a crash never leaves an empty `path`
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        if claimed:   # not what stood there before (claim)
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise disk_full(path) from None
        raise


class Occupied(PipelineError, FileExistsError):
    """Something not this user's file stands at an atomic write's temporary name: one line (a
    PipelineError), and an OSError to a caller for whom the write is a saving, not a duty (a memo)."""


def claim(tmp, path):
    """Make the temporary file `tmp` of `path` as a new, empty file of this process (O_EXCL, no link
    followed), so the writer then writes into it and nowhere else: in a folder others may write (speak
    --out /tmp/x.wav) a link planted at the predictable name would have sent the write, as this user,
    wherever it pointed. One left by a killed process of this user with the same pid is removed first;
    anything else there is a PipelineError naming it."""
    for _ in range(2):
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
            return True
        except FileExistsError:
            st = os.lstat(tmp)
            if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()):
                raise Occupied(f"{tmp}: something not this user's file (a link, another user's file) is where "
                                    f"the temporary file of {path} goes; remove it") from None
            os.unlink(tmp)   # ours, left by a killed process that had this pid
    raise PipelineError(f"{tmp}: made again as it was removed; is another process writing {path}?")


STALE_SECONDS = 600  # a temporary file untouched this long, with no Snakemake run holding its folder, is a leftover
_TEMPORARY = re.compile(r"\..+\.tmp\d+.*")   # `temporary`'s names: .NAME.tmpPID[suffix]


def remove_stale_temporaries(folder, older_than=STALE_SECONDS):
    """Remove the temporary files of atomic writes in `folder` (not below it) that a killed writer left:
    SIGKILL and SIGTERM (a SLURM time limit, Snakemake stopping its jobs) skip atomic_write's cleanup, and
    a shard's could be gigabytes, kept for good. Only this user's regular files, untouched for
    `older_than` seconds; callers make sure no run is writing there (planning: no other Snakemake holds
    the folder). -> the paths removed."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:   # no such folder yet, or not ours to list
        return removed
    now = time.time()
    for e in entries:
        if not _TEMPORARY.fullmatch(e.name):
            continue
        try:
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and now - st.st_mtime >= older_than:
                os.unlink(e.path)
                removed.append(e.path)
        except OSError:
            pass
    return removed



def host_id():
    """This host's name and its pid namespace where /proc shows one (containers started with one fixed
    hostname each have their own): where a pid means this process table. Temporary folders carry it
    (process_tag), so that a run on another node sharing the folder is never judged by
    this host's pids."""
    name = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
    try:
        return f"{name}.{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return name


def alive(pid):
    """Whether a process `pid` lives on this host (another user's counts); one that has exited but is not
    yet reaped (a zombie, /proc/PID/stat's state Z) does not."""
    fields = _proc_stat(pid)
    if fields is not None:
        return fields[0] != b"Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's process
        return True
    return True


def _proc_stat(pid):
    """/proc/PID/stat's fields after the command name (state first), None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        int(fields[19])
        return fields
    except (OSError, IndexError, ValueError):
        return None


def _started(pid):
    """When process `pid` started (clock ticks after boot, /proc/PID/stat's 22nd field); None when no
    such process lives here (a zombie, exited but not reaped, neither), 0 where /proc does not say (no
    /proc at all: a live process is never taken for a gone one)."""
    fields = _proc_stat(pid)
    if fields is None:
        return 0 if alive(pid) else None
    return None if fields[0] == b"Z" else int(fields[19])


def process_tag():
    """`{pid}.{start}-{host}`: this process, in the name of a temporary folder, so that a later run can
    prove its writer gone (remove_leftover_folders). The start time tells a pid a new process took; the
    host (with its pid namespace) keeps a run on another node sharing the folder from being judged by
    this host's pids."""
    return f"{os.getpid()}.{_started(os.getpid()) or 0}-{host_id()}"


LEFTOVER_SECONDS = 6 * 3600  # untouched this long, a temporary folder whose writer no pid can judge is a leftover


def untouched_seconds(path):
    """Seconds since anything under folder `path` was last written."""
    newest = os.lstat(path).st_mtime
    for root, dirs, names in os.walk(path):
        for name in dirs + names:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except OSError:
                pass
    return time.time() - newest


def tagged_folder(final, kind="tmp"):
    """`.{final.name}.{kind}{process_tag()}-0` beside `final`: the one folder of `kind` this process keeps
    there (export's new folder; `old`: the previous one moved aside), named as remove_leftover_folders reads."""
    final = Path(final)
    return final.with_name(f".{final.name}.{kind}{process_tag()}-0")


def remove_leftover_folders(final, what, log):
    """Remove the temporary folders a killed `what` left beside `final`: `.{final.name}.tmp{process_tag()}-XXXX`
    (tempfile.mkdtemp's, or tagged_folder's; `.old...` too), and the older forms without a start time
    (`.tmp{pid}`, `.old{pid}`, `.tmp{pid}-XXXX`) or with the host first (`.tmp-{host}-{pid}`, `.old-{host}-{pid}`). One
    rule, only this user's folders: one written on this host by a process no longer alive (or whose pid a
    later process took) goes now; one whose writer lives (same pid and start time) stays; one whose writer
    no pid here can judge (another host's, an older form's, no /proc) goes once nothing in it was written
    for LEFTOVER_SECONDS. Says in one line what it removed. -> the paths removed."""
    final = Path(final)
    host_ = r"[A-Za-z0-9._-]+"
    pattern = re.compile(rf"\.{re.escape(final.name)}\.(?:(?:tmp|old)(?P<pid>\d+)\.(?P<start>\d+)-(?P<host>{host_})-\w+"
                         rf"|(?:tmp|old)(?P<older>\d+)(?:-\w+)?|(?:tmp|old)-(?P<first>{host_})-(?P<last>\d+))", re.ASCII)
    host, removed = host_id(), []
    try:
        entries = sorted(os.scandir(final.parent), key=lambda e: e.name)
    except OSError:   # no such folder yet
        return removed
    for e in entries:
        found = pattern.fullmatch(e.name)
        if not found:
            continue
        pid = int(found["pid"] or found["older"] or found["last"])
        start, their = int(found["start"] or 0), found["host"] or found["first"]
        gone = False
        try:
            if their == host:
                if pid == os.getpid():
                    continue   # this run's own
                started = _started(pid)
                gone = started is None or 0 not in (start, started) and started != start
                if not gone and started == start != 0:
                    continue   # alive: its writer, by pid and start time
            if not gone and untouched_seconds(e.path) < LEFTOVER_SECONDS:
                continue   # a writer no pid here judges, still writing for all one can tell
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
                shutil.rmtree(e.path)
                removed.append(e.path)
        except OSError:
            pass
    if removed:
        log(f"removed what a killed {what} left beside {final}: {', '.join(Path(p).name for p in removed)}")
    return removed


class Busy(PipelineError):
    """Another process holds the lock file a job needs (exclusive): one line naming the holder."""


@contextlib.contextmanager
def exclusive(path, busy):
    """Hold lock file `path` while the block runs, so that a second run of the same job stops at its start,
    before any work, with Busy(busy(holder)): holder is "process PID on HOST", as the first run wrote it in the
    file. flock: the kernel releases a killed process's lock, and the next run takes its file over. The file
    is removed when the block ends, so nothing is left beside a user's folder: a run that locked a file its
    holder removed meanwhile locks the new one (_lock). A file system without locks (some network mounts)
    runs unlocked, as before. (train.run_lock holds runs/{name}/.train.lock with it.)"""
    path = Path(path)
    fd = _lock(path, busy)
    try:
        yield
    finally:
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(path)):   # ours still (not removed by hand)
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _lock(path, busy):
    """exclusive's lock: the open descriptor of lock file `path`, locked (or on a file system without locks,
    only open), with this process named in it; Busy(busy(holder)) while another process holds it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise PipelineError(f"{path}: cannot open this lock file ({e.strerror or e}); remove it and rerun") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise Busy(busy(holder)) from None
        except OSError:   # no locks on this file system
            return fd
        try:
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)   # its holder removed it as it ended: lock the file at `path` now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    except OSError:   # a full disk: the lock holds all the same, unnamed
        pass
    return fd


def atomic_write_bytes(path, data):
    """`data` to `path` atomically (and durably: atomic_write syncs before the rename)."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path, text):
    atomic_write_bytes(path, text.encode("utf-8"))
