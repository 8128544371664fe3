"""One error path for every command.

Expected failures (a bad config key, a malformed metadata line, a missing cache or checkpoint,
bad audio with `dataset.bad_audio: fail`) raise a subclass of `PipelineError` whose message names
the file or config key and the command that fixes it. `cli(main)` wraps a module's `main`: such an
error prints as one line, `error: <message>`, and exits with status 2; anything else is a bug and
keeps its traceback. Two failures that are not PipelineErrors print as one line too: a damaged
shard found by the loader's in-graph checksum assertion (TensorFlow's InvalidArgumentError whose
message starts with `GRAPH_MARK`), and a full disk (OSError ENOSPC: "no space left on device
writing X; free space and rerun").

    from pipeline.errors import PipelineError, cli

    @cli
    def main(argv=None): ...
"""
import errno
import functools
import os
import re
import select
import sys
from pathlib import Path

EXIT_EXPECTED = 2  # an expected failure; 1 stays Python's exit status for a traceback
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), as a shell reports a command it stopped


class PipelineError(ValueError):
    """An expected failure; the message names the file, line or config key and what to run."""


class MissingCheckpoint(PipelineError):
    """No checkpoint to synthesize, evaluate or resume from."""


def located(path):
    """`path` as a message names something not found there: a relative path with the working folder it
    was read in (a command run from another folder reads runs/ there, and "train first" alone would
    read as if the project's own run were missing)."""
    if Path(path).is_absolute():
        return str(path)
    try:
        return f"{path} (in the working folder {os.getcwd()})"
    except OSError:  # the working folder itself is gone
        return str(path)


class DiskFull(PipelineError):
    """ENOSPC while writing under cache.dir or runs_dir."""


GRAPH_MARK = "damaged cache shard"  # pipeline.shards.DAMAGED: how the loader's graph assertion starts
ON_DAMAGED = []  # callbacks(bin_path) for a shard the loader found damaged; pipeline.shards adds `unverify`


def unique_pairs(refuse):
    """A json.loads object_pairs_hook that calls refuse(key) (which raises) for a key given twice in one
    object: json keeps only the last, so what a reader checked need not be what is used."""
    def pairs_hook(pairs):
        out = {}
        for key, value in pairs:
            if key in out:
                refuse(key)
            out[key] = value
        return out
    return pairs_hook


def disk_full(path):
    return DiskFull(f"no space left on device writing {path}; free space and rerun")


def _one_line(e):
    """The one-line message of an expected failure that is not a PipelineError, else None."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return str(disk_full(e.filename or "(a file)"))
    text = str(e)
    if "No space left on device" in text:  # TensorFlow's (a ResourceExhaustedError from a checkpoint's save)
        where = re.search(r"(/[^\s;:'\"]+)", text)
        return str(disk_full(where[1] if where else "(a file)"))
    if isinstance(e, MemoryError) or type(e).__name__ == "ResourceExhaustedError":  # NumPy's, TensorFlow's
        what = re.sub(r"\{\{[^}]*\}\}\s*", "", (text.strip().splitlines() or [type(e).__name__])[0])[:200]
        return (f"out of memory ({what}): lower the model's sizes (model.*, vocoder.*, aligner.d_model) or the batch "
                "size (train.batch_size, vocoder.batch_size, aligner.batch_size), or free the memory other jobs hold")
    if GRAPH_MARK in text:  # tf.debugging.Assert: "assertion failed: [mark] [[b'path' ...]] [: ...]"
        body = text[text.index(GRAPH_MARK):].split("\n")[0]
        body = re.sub(r"[\[\]]|b'|b\"|'|\"|\s*\{\{node.*", "", body)
        for path in re.findall(r"\S+\.bin", body):
            for forget in ON_DAMAGED:
                forget(path)  # shards.unverify: planning hashes it again, whatever its timestamps say
        return re.sub(r"\s+", " ", body).replace(" :", ":").strip()
    return None


def _stdout_gone():
    """Whether standard output is a pipe whose reader has closed it (poll reports an error on it)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def not_utf8(args):
    """PipelineError naming the first of `args` (a command line) that is not UTF-8 text: Python keeps its
    bytes as lone surrogates, which fail later, wherever the text is written (a traceback)."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:
            raw = arg.encode("utf-8", "surrogateescape")
            shown = raw.decode("utf-8", "backslashreplace")
            raise PipelineError(f"argument '{shown}' is not UTF-8 text (byte {ord(arg[e.start]) - 0xDC00:#04x}); "
                                "paths, text and options are read as UTF-8") from None


def cli(main):
    """Run `main(argv)`; a PipelineError becomes one line on stderr and exit status 2, Ctrl-C one line
    and status 130 (what it stopped was written atomically: finished files are whole, the rest absent)."""
    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            not_utf8(sys.argv[1:] if argv is None else argv)
            return main(argv)
        except KeyboardInterrupt:
            print("stopped (Ctrl-C)", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            if not _stdout_gone():
                raise  # another pipe (a worker process's): a bug, not a reader that stopped
            # `python -m pipeline.config | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            raise SystemExit(0) from None
        except PipelineError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_EXPECTED) from None
        except Exception as e:
            line = _one_line(e)
            if line is None:
                raise
            print(f"error: {line}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_EXPECTED) from None
    return wrapper
