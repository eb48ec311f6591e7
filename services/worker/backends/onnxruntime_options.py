"""What an onnxruntime session is built with, read from the model config as Triton's
onnxruntime backend reads it (pure logic: no session is created here, no GPU needed).

- `parameters`: `intra_op_thread_count`, `inter_op_thread_count`, `execution_mode`
  (0 sequential, 1 parallel), `enable_mem_arena`, `enable_mem_pattern`, `session.*`
  entries, and the CUDA provider's `cudnn_conv_algo_search`, `gpu_mem_limit`,
  `arena_extend_strategy`, `do_copy_in_default_stream`, `enable_cuda_graph`;
- `optimization.graph.level`: -1 basic, 1 extended, anything else all optimizations;
- `optimization.execution_accelerators.gpu_execution_accelerator`: `tensorrt` (with
  `precision_mode`, `max_workspace_size_bytes`, `trt_*` options) and `cuda` (its
  options); the TensorRT provider is used only when asked for, as in Triton.

A provider the installed onnxruntime lacks is dropped with its reason in `fallbacks`,
which the backend logs; KIND_GPU instances always keep the CPU provider last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CPU, CUDA, TRT, OPENVINO = (
    "CPUExecutionProvider",
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "OpenVINOExecutionProvider",
)

_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED"}  # default: ORT_ENABLE_ALL
_CUDA_PARAMETERS = (
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
    "enable_cuda_graph",
)
_CONV_ALGO = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}  # Triton's numbers -> ORT's names
_ARENA = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}


@dataclass
class SessionPlan:
    options: dict[str, Any] = field(default_factory=dict)  # SessionOptions attribute -> value
    config_entries: dict[str, str] = field(default_factory=dict)  # SessionOptions.add_session_config_entry
    providers: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # requested providers dropped, and why


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _accelerators(config: dict[str, Any], side: str) -> list[dict[str, Any]]:
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    return list(accelerators.get(side, []))


def _tensorrt_options(parameters: dict[str, str], device: int) -> dict[str, str]:
    options = {"device_id": str(device)}
    for key, value in parameters.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode not in ("FP32", "FP16", "INT8"):
                raise ValueError(
                    f"unsupported precision mode '{value}' for the TensorRT accelerator (FP32, FP16 or INT8)"
                )
            options["trt_fp16_enable"] = "True" if mode in ("FP16", "INT8") else "False"
            options["trt_int8_enable"] = "True" if mode == "INT8" else "False"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = str(int(value))
        elif key == "int8_calibration_table_name":
            options["trt_int8_calibration_table_name"] = value
        elif key == "int8_use_native_calibration_table":
            options["trt_int8_use_native_calibration_table"] = "True" if _flag(value) else "False"
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise ValueError(f"unknown parameter '{key}' for the TensorRT execution accelerator")
    return options


def _cuda_options(parameters: dict[str, str], accelerator: dict[str, str], device: int) -> dict[str, str]:
    options = {"device_id": str(device)}
    for key in _CUDA_PARAMETERS:
        if key in parameters:
            value = parameters[key]
            if key == "cudnn_conv_algo_search":
                value = _CONV_ALGO.get(value, value)
            elif key == "arena_extend_strategy":
                value = _ARENA.get(value, value)
            options[key] = value
    options.update(accelerator)  # `cuda` accelerator parameters go to the provider unchanged
    return options


def build_session_plan(
    config: dict[str, Any], kind: str, device: int, threads: int, available: list[str]
) -> SessionPlan:
    """SessionOptions settings and the ordered execution providers for one instance."""
    parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
    plan = SessionPlan()
    intra = int(parameters.get("intra_op_thread_count", "0") or 0) or threads
    inter = int(parameters.get("inter_op_thread_count", "0") or 0)
    if intra > 0:
        plan.options["intra_op_num_threads"] = intra
    parallel = parameters.get("execution_mode", "0").strip() == "1"
    plan.options["execution_mode"] = "ORT_PARALLEL" if parallel else "ORT_SEQUENTIAL"
    # one instance per thread already gives the parallelism; inter-op threads only help ORT_PARALLEL
    plan.options["inter_op_num_threads"] = inter or (0 if parallel else 1)
    level = int(config.get("optimization", {}).get("graph", {}).get("level", 0) or 0)
    plan.options["graph_optimization_level"] = _GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL")
    if "enable_mem_arena" in parameters:
        plan.options["enable_cpu_mem_arena"] = _flag(parameters["enable_mem_arena"])
    if "enable_mem_pattern" in parameters:
        plan.options["enable_mem_pattern"] = _flag(parameters["enable_mem_pattern"])
    for key, value in parameters.items():
        if key.startswith("session."):
            plan.config_entries[key] = value

    if kind == "KIND_GPU":
        gpu = {
            a.get("name", ""): {k: str(v) for k, v in a.get("parameters", {}).items()}
            for a in _accelerators(config, "gpu_execution_accelerator")
        }
        unknown = sorted(set(gpu) - {"tensorrt", "cuda"})
        if unknown:
            raise ValueError(
                f"unknown gpu_execution_accelerator name '{unknown[0]}' (onnxruntime takes 'tensorrt' or 'cuda')"
            )
        if "tensorrt" in gpu:
            if TRT in available:
                plan.providers.append((TRT, _tensorrt_options(gpu["tensorrt"], device)))
            else:
                plan.fallbacks.append(
                    "the TensorRT accelerator was asked for but onnxruntime has no TensorrtExecutionProvider"
                )
        if CUDA in available:
            plan.providers.append((CUDA, _cuda_options(parameters, gpu.get("cuda", {}), device)))
        else:
            plan.fallbacks.append(
                "onnxruntime has no CUDAExecutionProvider (install `pip install 'shoal[gpu]'`, "
                f"available: {', '.join(available)}); running on the CPU"
            )
    else:
        for accelerator in _accelerators(config, "cpu_execution_accelerator"):
            name = accelerator.get("name", "")
            if name == "openvino" and OPENVINO in available:
                plan.providers.append((OPENVINO, {k: str(v) for k, v in accelerator.get("parameters", {}).items()}))
            elif name == "openvino":
                plan.fallbacks.append(
                    "the OpenVINO accelerator was asked for but onnxruntime has no OpenVINOExecutionProvider"
                )
            else:
                raise ValueError(f"unknown cpu_execution_accelerator name '{name}' (onnxruntime takes 'openvino')")
    plan.providers.append((CPU, {}))
    return plan
