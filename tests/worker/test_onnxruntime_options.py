"""Session options and execution providers from the config (Triton's onnxruntime backend)."""

from __future__ import annotations

import pytest

from services.worker.backends.onnxruntime_options import CPU, CUDA, TRT, build_session_plan

GPU_PROVIDERS = [TRT, CUDA, CPU]


def params(**values: str) -> dict:
    return {k: {"string_value": v} for k, v in values.items()}


def test_cpu_defaults_one_instance_thread_budget():
    plan = build_session_plan({"name": "m"}, "KIND_CPU", 0, 4, [CPU])
    assert plan.options == {
        "intra_op_num_threads": 4,
        "inter_op_num_threads": 1,
        "execution_mode": "ORT_SEQUENTIAL",
        "graph_optimization_level": "ORT_ENABLE_ALL",
    }
    assert plan.providers == [(CPU, {})] and plan.fallbacks == []


def test_parameters_and_graph_level_reach_the_session_options():
    config = {
        "parameters": params(
            intra_op_thread_count="3",
            inter_op_thread_count="2",
            execution_mode="1",
            enable_mem_arena="0",
            enable_mem_pattern="1",
            **{"session.use_env_allocators": "1"},
        ),
        "optimization": {"graph": {"level": -1}},
    }
    plan = build_session_plan(config, "KIND_CPU", 0, 8, [CPU])
    assert plan.options == {
        "intra_op_num_threads": 3,
        "inter_op_num_threads": 2,
        "execution_mode": "ORT_PARALLEL",
        "graph_optimization_level": "ORT_ENABLE_BASIC",
        "enable_cpu_mem_arena": False,
        "enable_mem_pattern": True,
    }
    assert plan.config_entries == {"session.use_env_allocators": "1"}
    assert (
        build_session_plan({"optimization": {"graph": {"level": 1}}}, "KIND_CPU", 0, 1, [CPU]).options[
            "graph_optimization_level"
        ]
        == "ORT_ENABLE_EXTENDED"
    )


def test_gpu_instance_uses_cuda_on_its_device_without_tensorrt_unless_asked():
    config = {"parameters": params(cudnn_conv_algo_search="1", gpu_mem_limit="1000")}
    plan = build_session_plan(config, "KIND_GPU", 1, 1, GPU_PROVIDERS)
    assert plan.providers == [
        (CUDA, {"device_id": "1", "cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1000"}),
        (CPU, {}),
    ]


def test_tensorrt_accelerator_options():
    config = {
        "optimization": {
            "execution_accelerators": {
                "gpu_execution_accelerator": [
                    {
                        "name": "tensorrt",
                        "parameters": {
                            "precision_mode": "FP16",
                            "max_workspace_size_bytes": "1073741824",
                            "trt_engine_cache_enable": "1",
                        },
                    },
                    {"name": "cuda", "parameters": {"cudnn_conv_use_max_workspace": "1"}},
                ]
            }
        }
    }
    plan = build_session_plan(config, "KIND_GPU", 0, 1, GPU_PROVIDERS)
    assert plan.providers == [
        (
            TRT,
            {
                "device_id": "0",
                "trt_fp16_enable": "True",
                "trt_int8_enable": "False",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "1",
            },
        ),
        (CUDA, {"device_id": "0", "cudnn_conv_use_max_workspace": "1"}),
        (CPU, {}),
    ]


def test_missing_gpu_providers_fall_back_with_reasons():
    config = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorrt"}]}}}
    plan = build_session_plan(config, "KIND_GPU", 0, 1, [CPU])
    assert plan.providers == [(CPU, {})]
    assert "no TensorrtExecutionProvider" in plan.fallbacks[0] and "running on the CPU" in plan.fallbacks[1]


def test_bad_accelerator_settings_are_errors():
    bad_name = {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorflow"}]}}}
    with pytest.raises(ValueError, match="unknown gpu_execution_accelerator name 'tensorflow'"):
        build_session_plan(bad_name, "KIND_GPU", 0, 1, GPU_PROVIDERS)
    bad_mode = {
        "optimization": {
            "execution_accelerators": {
                "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": {"precision_mode": "FP8"}}]
            }
        }
    }
    with pytest.raises(ValueError, match="unsupported precision mode 'FP8'"):
        build_session_plan(bad_mode, "KIND_GPU", 0, 1, GPU_PROVIDERS)


def test_plan_applies_to_onnxruntime_session_options():
    import onnxruntime as ort

    from services.worker.backends.onnxruntime_backend import session_options

    config = {
        "parameters": params(intra_op_thread_count="3", **{"session.use_env_allocators": "1"}),
        "optimization": {"graph": {"level": 1}},
    }
    options = session_options(build_session_plan(config, "KIND_CPU", 0, 1, [CPU]))
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.get_session_config_entry("session.use_env_allocators") == "1"


def test_gpu_instance_on_cpu_onnxruntime_logs_one_fallback_line(tmp_path, caplog):
    import onnxruntime as ort
    from onnx import TensorProto

    from services.repository import examples
    from services.worker.backends import Placement, onnxruntime_backend
    from shared.config.model_config import spec_from_json

    if CUDA in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: no fallback to see")
    model_dir = examples.write_model(tmp_path, "m", examples.identity_graph(TensorProto.FLOAT, 2, "m"), None)
    spec = spec_from_json(
        {
            "name": "m",
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )
    with caplog.at_level("WARNING", logger="shoal.worker"):
        instance = onnxruntime_backend.BACKEND.create(spec, model_dir, Placement(1, "KIND_GPU", 0, 1, "m_0"))
    assert isinstance(instance, onnxruntime_backend.OnnxInstance) and instance.providers == [CPU]
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("model 'm' instance 'm_0' (KIND_GPU, device 0): onnxruntime has no CUDAExecutionProvider")
    assert line.endswith("running on the CPU")
