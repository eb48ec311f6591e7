from __future__ import annotations

from services.gateway.metrics.prometheus_text import label_text


def test_a_namespaced_identity_is_labelled_as_triton_labels_it():
    assert label_text({"model": "/models/b::composing", "version": "1"}) == (
        '{model="composing",namespace="/models/b",version="1"}'
    )
    assert label_text({"model": "simple", "version": "1"}) == '{model="simple",version="1"}'
