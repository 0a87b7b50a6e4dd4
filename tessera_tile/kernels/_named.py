"""Kernels a module names (the compile tier's cases, benchmarks, guides), built on first use.

A module keeps ``NAMED = NamedKernels(__name__, {name: builder})`` and
``__getattr__ = NAMED.module_getattr``: ``from tessera_tile.kernels.transpose import
transpose_f32`` works as for any module attribute, and importing the module builds no kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any


class NamedKernels:
    def __init__(self, module: str, builders: dict[str, Callable[[], Any]]):
        self.module = module
        self._builders = builders
        self._build = functools.cache(lambda name: builders[name]())  # one object per name

    def __getitem__(self, name: str):
        return self._build(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._builders)

    def module_getattr(self, name: str):
        if name in self._builders:
            return self[name]
        raise AttributeError(f"module {self.module!r} has no attribute {name!r}")
