"""Placeholder names for the torchvision stand-in."""

from __future__ import annotations

from collections.abc import Callable


def placeholder_getattr(module: str) -> Callable[[str], type]:
    """A module ``__getattr__`` giving, for any public name, a class that cannot be used."""

    def __getattr__(name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")

        def refuse(*args: object, **kwargs: object) -> None:
            raise RuntimeError(f"{module}.{name} is a placeholder of the test's torchvision stand-in")

        return type(name, (), {"__module__": module, "__init__": refuse})

    return __getattr__
