"""benchmarks/mlserver_models.py writes MLServer's models; mlserver_peer.py reads wrk and renders the table."""

import json
import re
from pathlib import Path

from benchmarks.mlserver_models import MAX_BATCH_SIZE, write
from benchmarks.mlserver_peer import parse_wrk, render, wrk_script

WRK_OK = """Running 10s test @ http://127.0.0.1:1/v2/models/identity_fp32/infer
  1 threads and 16 connections
  Latency Distribution
     50%    4.81ms
     99%   12.00ms
  24000 requests in 10.01s, 5.00MB read
Requests/sec:   2397.60
"""


def test_each_model_gets_its_own_runtime_module_and_a_config_route_with_its_name(tmp_path: Path):
    onnx = tmp_path / "mlp.onnx"
    onnx.write_bytes(b"not really onnx")
    write(onnx, tmp_path / "models")
    for name, cls in (("identity_fp32", "Identity"), ("mlp_onnx_py", "Mlp")):
        settings = json.loads((tmp_path / "models" / name / "model-settings.json").read_text())
        assert settings["implementation"] == f"{name}_runtime.{cls}"  # one module name per model
        assert settings["max_batch_size"] == MAX_BATCH_SIZE and settings["max_batch_time"] > 0
        source = (tmp_path / "models" / name / f"{name}_runtime.py").read_text()
        compile(source, f"{name}_runtime.py", "exec")
        assert f'rest_path="/v2/models/{name}/config", rest_method="GET"' in source
        assert f'"name": "{name}", "max_batch_size": {MAX_BATCH_SIZE}' in source
    assert (tmp_path / "models" / "mlp_onnx_py" / "model.onnx").read_bytes() == b"not really onnx"
    assert not (tmp_path / "models" / "identity_fp32" / "model.onnx").exists()


def test_the_wrk_script_posts_one_batch_1_json_request_of_the_given_size(tmp_path: Path):
    lua = wrk_script(tmp_path, 256).read_text()
    body = json.loads(re.search(r"wrk\.body = \[\[(.*?)\]\]", lua, re.S).group(1))
    (tensor,) = body["inputs"]
    assert tensor["shape"] == [1, 256] and len(tensor["data"]) == 256 and tensor["datatype"] == "FP32"
    assert 'headers["Content-Type"] = "application/json"' in lua


def test_wrk_numbers_are_read_and_any_refused_answer_makes_the_run_an_error():
    assert parse_wrk(WRK_OK, "") == {"throughput": 2397.6, "p50_us": 4810.0, "requests": 24000}
    refused = WRK_OK + "  Non-2xx or 3xx responses: 12\n"
    assert "error" in parse_wrk(refused, "")
    assert "error" in parse_wrk(WRK_OK, 'HTTP 400 {"error":"bad"}\n')
    assert "error" in parse_wrk("unable to connect", "")


def test_the_table_gives_shoal_s_throughput_over_each_other_server_and_n_a_for_a_failed_server():
    run = {"throughput": 100.0, "p50_us": 5000.0, "server_cpu_us_per_request": 300.0}
    results = {
        "identity_json_c16": {
            "triton": [dict(run, throughput=400.0), dict(run, throughput=200.0)],
            "shoal": [run, run],
            "mlserver": [{"error": "timeout"}, {"error": "timeout"}],
        }
    }
    lines = render(results)
    triton = next(line for line in lines if "| triton |" in line)
    shoal = next(line for line in lines if "| shoal |" in line)
    mlserver = next(line for line in lines if "| mlserver |" in line)
    assert triton.endswith("| 0.33× |")  # 100 / median(400, 200)
    assert shoal.endswith("|  |")
    assert "n/a" in mlserver and "error, error" in mlserver
    assert render({}) == []
