"""config.pbtxt text read back into the server's JSON, to check what `shoal analyze` writes
(shoal/analyze/configs.py's `to_pbtxt` goes the other way)."""

from __future__ import annotations

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2


def parse_pbtxt(text: str) -> dict:
    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
