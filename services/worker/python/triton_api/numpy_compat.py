"""numpy 1's names for python models written for Triton's python backend.

Triton's python backend environment ships numpy 1.x, so models in the wild use names numpy 2
removed (`np.NINF`, `np.float_`, `np.bool8`, ...): with numpy 2 they fail with AttributeError
(issue 28 item 13). Before a model is imported its process gets each removed name back as an
alias of what numpy 2 calls it (the NumPy 2.0 migration guide's table), set only where numpy
has no such attribute: nothing numpy 2 still defines is changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _aliases() -> dict[str, Any]:
    return {
        # constants
        "Inf": np.inf,
        "Infinity": np.inf,
        "NINF": -np.inf,
        "PINF": np.inf,
        "infty": np.inf,
        "NaN": np.nan,
        "NAN": np.nan,
        "NZERO": -0.0,
        "PZERO": 0.0,
        # scalar types
        "float_": np.float64,
        "complex_": np.complex128,
        "cfloat": np.complex128,
        "singlecomplex": np.complex64,
        "longfloat": np.longdouble,
        "clongfloat": np.clongdouble,
        "longcomplex": np.clongdouble,
        "string_": np.bytes_,
        "unicode_": np.str_,
        "bool8": np.bool_,
        "int0": np.intp,
        "uint0": np.uintp,
        "object0": np.object_,
        "str0": np.str_,
        "bytes0": np.bytes_,
        "void0": np.void,
        # functions
        "product": np.prod,
        "cumproduct": np.cumprod,
        "sometrue": np.any,
        "alltrue": np.all,
        "round_": np.round,
        "asfarray": lambda a, dtype=np.float64: np.asarray(
            a, dtype=dtype if np.issubdtype(dtype, np.inexact) else np.float64
        ),
    }


def install() -> list[str]:
    """Give numpy back the numpy 1 names it lacks; returns the names added (none on numpy 1)."""
    added = []
    for name, value in _aliases().items():
        try:
            getattr(np, name)
        except AttributeError:
            setattr(np, name, value)
            added.append(name)
    return added
