"""pipeline/files.py's lock (files.exclusive), between real processes: a live holder refused by name, a
killed one's lock taken over, nothing left once the block ends."""
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import files

ROOT = Path(__file__).resolve().parent.parent
HOLD = """
import sys, time
from pipeline import files
with files.exclusive(sys.argv[1], str):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_live_holder_is_named_and_a_killed_ones_lock_is_taken_over(tmp_path):
    lock = tmp_path / ".job.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        named = f"process {holder.pid} on {socket.gethostname()}"
        with pytest.raises(files.Busy, match=f"^another run: {re.escape(named)}$"):
            with files.exclusive(lock, lambda who: f"another run: {who}"):
                raise AssertionError("entered while another process holds the lock")
    finally:
        holder.kill()
        holder.wait()
    assert lock.read_text() == named + "\n"          # a killed holder's file stays; the kernel let go of its lock
    with files.exclusive(lock, str):
        assert lock.read_text() == f"process {os.getpid()} on {socket.gethostname()}\n"
    assert os.listdir(tmp_path) == []                # removed when the block ends
    with pytest.raises(KeyError), files.exclusive(lock, str):
        raise KeyError("the job failed")
    assert os.listdir(tmp_path) == []                # on a failure too
