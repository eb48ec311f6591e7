"""The embedded cluster's model store is a scratch directory (shared/process/scratch.py) that goes with the
cluster: at its stop, or when it is dropped without one (a script that never ran it)."""

from __future__ import annotations

import gc
import tempfile

import pytest

from shoal.pytriton.embedded import EmbeddedCluster
from shoal.pytriton.exceptions import PyTritonValidationError
from shoal.pytriton.triton import TritonConfig


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_store_goes_with_a_stop_or_with_the_cluster(tmp):
    stopped = EmbeddedCluster(TritonConfig(allow_grpc=False))
    assert stopped.workspace is not None and stopped.workspace.is_dir()
    stopped.stop()
    assert not stopped.workspace.exists()
    dropped = EmbeddedCluster(TritonConfig(allow_grpc=False))
    workspace = dropped.workspace
    del dropped
    gc.collect()
    assert workspace is not None and not workspace.exists()
    with pytest.raises(PyTritonValidationError):  # refused settings: nothing is left either
        EmbeddedCluster(TritonConfig(cache_config=["nope,size=1"]))
    gc.collect()
    assert list(tmp.glob("shoal-pytriton-*")) == []
