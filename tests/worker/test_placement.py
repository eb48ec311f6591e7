"""instance_group -> instances (Triton's SetInstances), as pure logic."""

from __future__ import annotations

import pytest

from services.worker.gpus import visible_ids
from services.worker.placement import InstancePlan, plan_instances
from shared.errors import ShoalError


def config(*groups: dict) -> dict:
    return {"name": "m", "instance_group": list(groups)}


def test_cpu_groups_name_instances_like_triton():
    plans = plan_instances(
        config({"name": "m_0", "kind": "KIND_CPU", "count": 1}, {"name": "m_1", "kind": "KIND_CPU", "count": 2}),
        gpus=[],
    )
    assert plans == [
        InstancePlan("m_0", "m_0", "KIND_CPU", 0),
        InstancePlan("m_1_0", "m_1", "KIND_CPU", 0),
        InstancePlan("m_1_1", "m_1", "KIND_CPU", 0),
    ]


def test_gpu_count_is_per_listed_gpu():
    plans = plan_instances(config({"name": "g", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}), gpus=[0, 1])
    assert [(p.name, p.device) for p in plans] == [("g_0", 0), ("g_0", 1), ("g_1", 0), ("g_1", 1)]
    assert {p.kind for p in plans} == {"KIND_GPU"}


def test_gpu_group_without_gpus_takes_all_of_the_workers():
    plans = plan_instances(config({"name": "g", "kind": "KIND_GPU", "count": 1}), gpus=[0, 1, 2])
    assert [p.device for p in plans] == [0, 1, 2]


def test_gpu_group_on_a_worker_without_gpus_fails_like_triton():
    with pytest.raises(ShoalError, match="instance group g of model m has kind KIND_GPU but no GPUs are available"):
        plan_instances(config({"name": "g", "kind": "KIND_GPU", "count": 1}), gpus=[])
    with pytest.raises(ShoalError, match="instance group g of model m specifies invalid or unsupported gpu id 3"):
        plan_instances(config({"name": "g", "kind": "KIND_GPU", "count": 1, "gpus": [3]}), gpus=[0])


def test_auto_and_model_kinds():
    assert plan_instances(config({"name": "a", "kind": "KIND_AUTO"}), gpus=[])[0].kind == "KIND_CPU"
    assert plan_instances(config({"name": "a", "kind": "KIND_AUTO"}), gpus=[0])[0].kind == "KIND_GPU"
    assert plan_instances(config({"name": "k", "kind": "KIND_MODEL", "count": 1}), gpus=[0])[0] == InstancePlan(
        "k", "k", "KIND_MODEL", 0
    )
    assert plan_instances({"name": "m"}, gpus=[]) == [InstancePlan("m", "m", "KIND_CPU", 0)]


def test_cuda_visible_devices_renumbers_from_zero():
    assert visible_ids(4, None) == [0, 1, 2, 3]
    assert visible_ids(4, "2,3") == [0, 1]
    assert visible_ids(4, "") == []
    assert visible_ids(2, "0,-1,1") == [0]
    assert visible_ids(0, "0,1") == []
