"""One shape for every plug point: a `Registry` of named entries, each declaring its own properties.

The model kinds (pipeline/models/__init__.py), the vocoder kinds (pipeline/vocoder/kinds.py), the
corpus formats (pipeline/formats.py) and the pitch methods (pipeline/pitch.py) are each one
registry. A registry names the config key it serves and the properties every entry has (with their
defaults); an entry sets the ones where it differs. A new kind is one `add` beside its code.

    VOCODERS = Registry("vocoder.kind", build=None, trained=True)
    VOCODERS.add("griffin_lim", trained=False)
    VOCODERS.get(cfg["vocoder"]["kind"]).trained     # unknown name: one line naming the key and the valid names
"""
from types import MappingProxyType, SimpleNamespace

from pipeline.errors import PipelineError


class Registry:
    """Named entries with the same properties; iterating gives the names in the order they were added."""

    def __init__(self, key, error=PipelineError, what="name", **properties):
        self.key, self.error, self.what = key, error, what
        self.properties = MappingProxyType(dict(properties))  # name -> default
        self._entries = {}

    def add(self, name, **props):
        unknown = sorted(set(props) - set(self.properties))
        if unknown:
            raise TypeError(f"{self.key} {name!r}: no such properties {unknown}; entries have {sorted(self.properties)}")
        if name in self._entries:
            raise TypeError(f"{self.key} {name!r} is registered twice")
        self._entries[name] = SimpleNamespace(name=name, **{**self.properties, **props})
        return self._entries[name]

    def get(self, name, key=None):
        """The entry called `name`; else `error` naming the key (`key` overrides the registry's, e.g. with
        a list index) and the valid names."""
        if name not in self._entries:
            raise self.error(f"{key or self.key}: unknown {self.what} {name!r}; valid: {', '.join(self._entries)}")
        return self._entries[name]

    def __contains__(self, name):
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __repr__(self):
        return f"Registry({self.key!r}: {', '.join(self._entries)})"
