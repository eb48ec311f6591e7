"""numpy 1's removed names come back for python models; nothing numpy still has is touched."""

from __future__ import annotations

import numpy as np

from services.worker.python.triton_api import numpy_compat


def test_removed_names_alias_numpy2s():
    numpy_compat.install()
    assert np.NINF == -np.inf and np.PINF == np.inf and np.isnan(np.NaN)
    assert np.float_ is np.float64 and np.complex_ is np.complex128 and np.bool8 is np.bool_
    assert np.string_ is np.bytes_ and np.unicode_ is np.str_ and np.int0 is np.intp
    assert np.product([2, 3]) == 6 and np.alltrue([True]) and not np.sometrue([False])
    assert np.asfarray([1, 2]).dtype == np.float64


def test_nothing_numpy_defines_is_replaced():
    before = {name: getattr(np, name) for name in ("inf", "float64", "bool_", "prod", "round")}
    numpy_compat.install()
    assert numpy_compat.install() == []  # a second call adds nothing
    assert all(getattr(np, name) is value for name, value in before.items())
