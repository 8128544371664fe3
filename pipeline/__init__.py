"""Text-to-speech training pipeline: caches, data loading, models, training, synthesis, evaluation, diagnosis."""
import contextlib
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


def _standard_streams():
    """Descriptors 0-2 open, each on /dev/null where the caller closed it (`speak ... 2>&-`, a daemon's
    start): otherwise the next file opened takes the closed descriptor, and TensorFlow's start-up lines
    and every later error would be written into a wav or a checkpoint. sys.stderr is then that
    /dev/null (Python leaves it None, on which the quiet import below failed without a line, and print
    would fall back to standard output: raw audio for `speak --raw`). sys.stdin and sys.stdout stay
    None, as Python sets them: the commands that read or write them say so in one line."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: open() takes the lowest free descriptor, this one
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


_standard_streams()

# TensorFlow uses oneDNN's CPU kernels by default only on CPUs with AVX-512 VNNI, AVX-512 BF16 or AMX.
# AVX2 CPUs (many AMD EPYC and Ryzen parts, older Xeons) get Eigen's kernels. On a 2-core AVX2 EPYC,
# oneDNN made the demo's FastPitch step 1.2-1.4x faster and the source-filter vocoder's 1.6-2.2x
# faster (benchmarks/cpu_kernels.py; docs/scaling.md, "CPU kernels"). So every pipeline job, and
# every process it starts, turns oneDNN on, unless the environment already sets it
# (`TF_ENABLE_ONEDNN_OPTS=0`). TensorFlow reads the variable when it loads.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


class _Around:
    """A meta path finder for one module: its own loader executes it, once, inside `around(module)`
    (a context manager), e.g. with descriptor 2 on /dev/null, or patching it after. A meta path
    finder and loader by protocol; importlib.abc itself costs every job ~40 ms of imports."""

    def __init__(self, name, around):
        self.name, self.around, self.loader = name, around, None

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the finders after this one: the module's own spec
        if spec is not None and spec.loader is not None:
            self.loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with self.around(module):
            self.loader.exec_module(module)

    def __getattr__(self, attribute):  # get_source, is_package, ...: the module's own loader's
        if attribute == "loader":
            raise AttributeError(attribute)
        return getattr(self.loader, attribute)


@contextlib.contextmanager
def _quiet(module):
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


# What Keras imports while it loads, only for features the pipeline never uses, each inside its own
# `try: import X / except ImportError` (Keras then treats X as absent): the module Keras would load and
# the Keras modules whose import of it fails. Importing TensorFlow and Keras: 8.1 CPU s with all three,
# 6.5 without scikit-learn, 5.2 without any (benchmarks/job_startup.py --job tensorflow). Any other
# module, librosa and the pipeline's own figures included, imports them as usual when it needs them.
KERAS_SKIPS = {
    "sklearn": "keras.src.wrappers",                  # scikit-learn wrappers (librosa depends on scikit-learn)
    "pandas": "keras.src.trainers.data_adapters",     # model.fit on DataFrames
    "matplotlib": "keras.src.visualization",          # image-gallery plots; pyplot alone is ~0.6 s
}


class _KerasWithoutExtras:
    """A meta path finder that fails the imports KERAS_SKIPS names, made by the Keras modules it names."""

    def find_spec(self, name, path=None, target=None):
        importer = KERAS_SKIPS.get(name)
        if importer is None:
            return None
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            frame = frame.f_back  # importlib's own frames, up to the module whose `import` this is
        if frame is not None and frame.f_globals.get("__name__", "").startswith(importer):
            raise ModuleNotFoundError(f"{name} is not loaded for {importer} (pipeline/__init__.py)", name=name)
        return None


if "keras" not in sys.modules:
    sys.meta_path.insert(0, _KerasWithoutExtras())
if QUIET and "tensorflow" not in sys.modules:
    sys.meta_path.insert(0, _Around("tensorflow", _quiet))


# phonemizer loads its own copy of libespeak-ng for each wrapper it makes (the library keeps its state
# in globals, and dlopen returns one handle per file): it copies the library into a new mkdtemp folder
# and removes that folder only when the wrapper is collected or the interpreter exits normally
# (weakref.finalize). A process stopped by a signal (SIGTERM from SLURM, systemd, `kill` or a stopped
# `serve`; SIGKILL) never got there, and each left two copies, 1.1 MB, in $TMPDIR. Once dlopen has
# mapped a copy, its file is not needed (its pages stay while mapped): when this package is imported
# before phonemizer, each wrapper removes its folder as soon as its library is loaded, in place of
# that finalizer (which only removed the folder: phonemizer gives it no library to close).
ESPEAK_API = "phonemizer.backend.espeak.api"


@contextlib.contextmanager
def _copies_off_disk(api):
    yield
    if sys.platform != "win32" and hasattr(api, "EspeakAPI") and hasattr(api, "weakref"):
        api.EspeakAPI.__init__ = _removing_its_copy(api, api.EspeakAPI.__init__)


def _removing_its_copy(api, init):
    import functools
    import shutil
    import threading
    import types

    lock, real = threading.Lock(), api.weakref
    no_finalizer = types.SimpleNamespace(finalize=lambda *args, **kwargs: None)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        with lock:  # the module's `weakref` is swapped while one wrapper is made
            api.weakref = no_finalizer
            try:
                init(self, *args, **kwargs)
            finally:
                api.weakref = real
                folder = getattr(self, "_tempdir", None)
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)
    return __init__


if ESPEAK_API not in sys.modules:
    sys.meta_path.insert(0, _Around(ESPEAK_API, _copies_off_disk))
