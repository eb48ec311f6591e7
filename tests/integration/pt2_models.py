"""PyTorch 2 programs (`model.pt2`, platform `torch_aoti`) written for the tests: a torch.export
ExportedProgram and an AOTInductor package compiled here, each with its config as Triton's
PyTorch backend reads it. Needs torch; the AOTInductor package also a C++ compiler."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

BATCH = torch.export.Dim("batch", min=1, max=8)


class Complex(torch.nn.Module):
    """Triton's README shape: a dict among the positional arguments, a keyword argument, a dict result."""

    def forward(self, a: torch.Tensor, b: torch.Tensor, options: dict[str, torch.Tensor], *, k: torch.Tensor):
        return {"AAA": a + b, "ZZZ": a - b, "BBB": (a * 2, options["opt"]), "K": k * 3}


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        return a + b, a - b


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x * 2


COMPLEX_CONFIG = """
name: "pt2_complex"
backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 1000 }
input [
  { name: "ARGS[0]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "ARGS[1]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "ARGS[2][opt]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "KWARGS[k]" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "RESULT[AAA]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "RESULT[BBB][0]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT__3" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "RESULT[K]" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "RESULT[ZZZ]" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# no backend line: Triton core completes it (pytorch, model.pt2) from the platform
AOTI_CONFIG = """
name: "pt2_aoti"
platform: "torch_aoti"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 1000 }
input [
  { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

BF16_CONFIG = """
name: "pt2_bf16"
backend: "pytorch"
platform: "torch_aoti"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_BF16 dims: [ 2, 3 ] } ]
output [ { name: "RESULT" data_type: TYPE_BF16 dims: [ 2, 3 ] } ]
"""


def _config(source: str, name: str, inputs: str | None = None) -> str:
    config = source.replace(source.split('"')[1], name, 1)
    if inputs is not None:
        start, end = config.index("input ["), config.index("output [")
        config = config[:start] + inputs + "\n" + config[end:]
    return config


def _write(root: Path, name: str, config: str, program: torch.export.ExportedProgram | bytes) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    path = root / name / "1" / "model.pt2"
    if isinstance(program, bytes):
        path.write_bytes(program)
    else:
        torch.export.save(program, str(path))
    return path


def rows(n: int = 3) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(n, 4) for _ in range(4))


def exported_models(root: Path) -> None:
    """The ExportedPrograms, a package that is no archive, and configs Triton's names refuse."""
    a, b, opt, k = rows(2)
    complex_ep = torch.export.export(
        Complex(),
        (a, b, {"opt": opt}),
        {"k": k},
        dynamic_shapes=({0: BATCH}, {0: BATCH}, {"opt": {0: BATCH}}, {0: BATCH}),
    )
    _write(root, "pt2_complex", COMPLEX_CONFIG, complex_ep)
    bf16 = torch.export.export(Doubler(), (torch.ones(2, 3, dtype=torch.bfloat16),))
    _write(root, "pt2_bf16", BF16_CONFIG, bf16)
    # the program answers INT64 where the config says FP32
    wrong_type = BF16_CONFIG.replace("TYPE_BF16", "TYPE_INT64", 1).replace("TYPE_BF16", "TYPE_FP32")
    longs = torch.export.export(Doubler(), (torch.ones(2, 3, dtype=torch.int64),))
    _write(root, "pt2_wrong_type", _config(wrong_type, "pt2_wrong_type"), longs)
    _write(root, "pt2_bad_file", _config(AOTI_CONFIG, "pt2_bad_file"), b"not a PT2 archive")
    add_sub = torch.export.export(AddSub(), rows(2)[:2], dynamic_shapes=({0: BATCH}, {0: BATCH}))
    one_input = '\ninput [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    _write(root, "pt2_one_input", _config(AOTI_CONFIG, "pt2_one_input", one_input), add_sub)
    static = """
name: "pt2_static"
platform: "torch_aoti"
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
"""
    _write(root, "pt2_static", static, torch.export.export(AddSub(), rows(2)[:2]))
    bad_name = '\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    _write(root, "pt2_bad_name", _config(AOTI_CONFIG, "pt2_bad_name", bad_name), add_sub)


def compiler() -> str | None:
    """The C++ compiler AOTInductor builds with (torch's `cpp.cxx` setting, else `g++`), if present."""
    from torch._inductor import config

    configured = config.cpp.cxx[0] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
    return shutil.which(configured or "g++")


def aoti_model(root: Path) -> None:
    """An AOTInductor package of AddSub with a dynamic batch; the wrapper built at -O0 (half the
    compile time here, ~25 s on a loaded 2-core machine)."""
    a, b = rows(2)[:2]
    program = torch.export.export(AddSub(), (a, b), dynamic_shapes=({0: BATCH}, {0: BATCH}))
    (root / "pt2_aoti" / "1").mkdir(parents=True)
    (root / "pt2_aoti" / "config.pbtxt").write_text(AOTI_CONFIG)
    torch._inductor.aoti_compile_and_package(  # type: ignore[attr-defined]
        program,
        package_path=str(root / "pt2_aoti" / "1" / "model.pt2"),
        inductor_configs={"aot_inductor.compile_wrapper_opt_level": "O0"},
    )
