"""Control tensors and implicit state built by the worker from `SeqControl`."""

from __future__ import annotations

import numpy as np
import pytest

from services.worker.sequences.controls import control_arrays, flags
from services.worker.sequences.state import StateStore
from shared.config.sequence_config import sequence_config
from shared.wire.messages import SeqControl

CONFIG = {
    "name": "m",
    "max_batch_size": 4,
    "sequence_batching": {
        "max_sequence_idle_microseconds": 0,
        "direct": {},
        "control_input": [
            {"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]},
            {"name": "E", "control": [{"kind": "CONTROL_SEQUENCE_END", "bool_false_true": [False, True]}]},
            {"name": "R", "control": [{"kind": "CONTROL_SEQUENCE_READY", "fp32_false_true": [-1.0, 2.5]}]},
            {"name": "C", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}]},
        ],
        "state": [
            {
                "input_name": "SIN",
                "output_name": "SOUT",
                "data_type": "TYPE_FP32",
                "dims": [2],
                "initial_state": [{"data_type": "TYPE_FP32", "dims": [2], "zero_data": True, "name": "z"}],
            }
        ],
    },
}


def test_config_defaults():
    config = sequence_config(CONFIG)
    assert config.strategy == "direct" and config.idle_us == 1_000_000 and config.slots_per_instance == 4
    assert sequence_config({"name": "x"}) is None


def test_control_tensors_use_the_configured_types_and_values():
    config = sequence_config(CONFIG)
    arrays = control_arrays(config, SeqControl(corrid=2**64 - 1, seq=1, start=True, end=False))
    assert arrays["S"].dtype == np.int32 and arrays["S"].tolist() == [[1]]
    assert arrays["E"].dtype == np.bool_ and arrays["E"].tolist() == [[False]]
    assert arrays["R"].dtype == np.float32 and arrays["R"].tolist() == [[2.5]]
    assert arrays["C"].dtype == np.uint64 and arrays["C"].tolist() == [[2**64 - 1]]
    assert flags(SeqControl(corrid=1, seq=1, start=True, end=True)) == 3
    with pytest.raises(ValueError):
        control_arrays(config, SeqControl(corrid="text", seq=1))


def test_implicit_state_carries_over_and_resets():
    store = StateStore(sequence_config(CONFIG), None)
    first = SeqControl(corrid=1, seq=1, start=True)
    assert store.inputs(first)["SIN"].tolist() == [[0.0, 0.0]]
    outputs = {"OUT": np.ones(1), "SOUT": np.array([[1.0, 2.0]], np.float32)}
    store.keep(first, outputs)
    assert "SOUT" not in outputs  # never returned to the client
    middle = SeqControl(corrid=1, seq=1)
    assert store.inputs(middle)["SIN"].tolist() == [[1.0, 2.0]]
    assert store.inputs(SeqControl(corrid=1, seq=2))["SIN"].tolist() == [[0.0, 0.0]]  # a reused id: new sequence
    store.keep(SeqControl(corrid=1, seq=1, end=True), {"SOUT": np.zeros((1, 2), np.float32)})
    assert len(store) == 0
    store.keep(middle, {"SOUT": np.zeros((1, 2), np.float32)})
    store.drop(1, 1)
    assert len(store) == 0


def test_initial_state_from_a_data_file(tmp_path):
    config = {
        **CONFIG,
        "sequence_batching": {
            **CONFIG["sequence_batching"],
            "state": [
                {
                    "input_name": "SIN",
                    "output_name": "SOUT",
                    "data_type": "TYPE_INT32",
                    "dims": [-1],
                    "initial_state": [{"data_type": "TYPE_INT32", "dims": [3], "data_file": "init.bin", "name": "f"}],
                }
            ],
        },
    }
    np.array([4, 5, 6], np.int32).tofile(tmp_path / "init.bin")
    store = StateStore(sequence_config(config), tmp_path)
    assert store.inputs(SeqControl(corrid="a", seq=1, start=True))["SIN"].tolist() == [[4, 5, 6]]


def test_direct_rows_follow_slots_with_not_ready_padding():
    from services.worker.sequences.controls import pad_slots

    config = sequence_config(CONFIG)
    controls = [SeqControl(corrid=7, seq=1, slot=2), SeqControl(corrid=9, seq=2, slot=0, start=True)]
    rows = [{"IN": np.full((1, 2), float(c.corrid), np.float32), **control_arrays(config, c)} for c in controls]
    padded, where = pad_slots(config, controls, rows, {"SIN": np.zeros((1, 2), np.float32)})
    assert where == [2, 0] and len(padded) == 3
    assert padded[2] is rows[0] and padded[0] is rows[1]
    assert padded[1]["R"].tolist() == [[-1.0]] and padded[1]["C"].tolist() == [[0]]  # not ready
    assert padded[1]["IN"].tolist() == [[0.0, 0.0]] and padded[1]["SIN"].shape == (1, 2)


def test_a_start_on_a_slot_drops_the_state_its_previous_sequence_left():
    store = StateStore(sequence_config(CONFIG), None)
    first = SeqControl(corrid=1, seq=10, start=True, end=False, slot=0)
    store.inputs(first, 0)
    store.keep(first, {"SOUT": np.ones((1, 2), np.float32)})
    assert len(store) == 1  # its END never came (e.g. its scheduler died)
    store.inputs(SeqControl(corrid=2, seq=11, start=True, end=False, slot=0), 0)
    assert len(store) == 0
