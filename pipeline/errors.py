"""One error path for every command.

Expected failures (a bad config key, a malformed metadata line, a missing cache or checkpoint,
bad audio with `dataset.bad_audio: fail`) raise a subclass of `PipelineError` whose message names
the file or config key and the command that fixes it. `cli(main)` wraps a module's `main`: such an
error prints as one line, `error: <message>`, and exits with status 2; anything else is a bug and
keeps its traceback.

    from pipeline.errors import PipelineError, cli

    @cli
    def main(argv=None): ...
"""
import functools
import sys

EXIT_EXPECTED = 2  # an expected failure; 1 stays Python's exit status for a traceback


class PipelineError(ValueError):
    """An expected failure; the message names the file, line or config key and what to run."""


class MissingCheckpoint(PipelineError):
    """No checkpoint to synthesize, evaluate or resume from."""


def cli(main):
    """Run `main(argv)`; a PipelineError becomes one line on stderr and exit status 2."""
    @functools.wraps(main)
    def wrapper(argv=None):
        try:
            return main(argv)
        except PipelineError as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_EXPECTED) from None
    return wrapper
