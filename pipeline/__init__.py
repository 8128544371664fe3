"""Text-to-speech training pipeline: caches, data loading, models, training, synthesis, evaluation, diagnosis."""
import importlib
import importlib.util
import os
import sys

# TensorFlow prints its C++ start-up lines (the oneDNN notice, "Could not find cuda drivers", cuInit
# on a host without a GPU) straight to file descriptor 2 while it loads, before its own log level
# applies; they would bury the progress lines in every console and log. The first `import tensorflow`
# made under this package therefore runs with descriptor 2 pointed at /dev/null, and TensorFlow's own
# log level is then 3 (errors still raise in Python). `TF_CPP_MIN_LOG_LEVEL=0 snakemake ...` shows all.
QUIET = os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3") != "0"


class _QuietTensorFlow:
    # a meta path finder and loader by protocol; importlib.abc itself costs every job ~40 ms of imports
    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        try:
            importlib.import_module("tensorflow")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return sys.modules[spec.name]

    def exec_module(self, module):
        pass


if QUIET and "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, _QuietTensorFlow())
