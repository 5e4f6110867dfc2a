"""Find lua/ and sql/ at run time: inside the wheel (fencepost/_lua, fencepost/_sql)
or, in a source checkout or editable install, at the repository root."""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    for candidate in (_HERE.parent / f"_{name}", _HERE.parent.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"fencepost resource folder {name!r} not found next to {_HERE}")
