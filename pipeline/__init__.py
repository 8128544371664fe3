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


class _KerasWithoutScikitLearn:
    """Keras imports scikit-learn while it loads, for its scikit-learn wrappers (keras.wrappers), when
    scikit-learn is installed (librosa depends on it): 1.7 of the 8 CPU seconds every TensorFlow process
    spends importing TensorFlow and Keras. The pipeline uses none of those wrappers, so Keras's
    `import sklearn` fails (Keras then treats scikit-learn as absent); any other module, librosa
    included, imports scikit-learn as usual."""

    def find_spec(self, name, path=None, target=None):
        if name != "sklearn":
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back  # importlib's own frames, up to the module whose `import sklearn` this is
        if frame is not None and frame.f_globals.get("__name__", "").startswith("keras.src.wrappers"):
            raise ModuleNotFoundError("scikit-learn is not loaded for Keras's wrappers (pipeline/__init__.py)",
                                      name=name)
        return None


if "keras" not in sys.modules:
    sys.meta_path.insert(0, _KerasWithoutScikitLearn())
if QUIET and "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, _QuietTensorFlow())
