"""The text-recognition model of Triton's conceptual-guide tutorial, built as ONNX without torch.

deep-text-recognition-benchmark's "None-VGG-BiLSTM-CTC" STR model (issue 23 item 4): a VGG
feature extractor (1 -> 64 -> 128 -> 256 -> 512 channels), two bidirectional LSTMs of 256
hidden units each followed by a linear layer, and a linear prediction to 37 classes (CTC).
Weights are random (seeded): the benchmark measures serving, not accuracy.

Input ``input.1`` FP32 [batch, 1, 32, 100]; output ``308`` FP32 [batch, 24, 37] (the tutorial's
names). Written with ``onnx.helper`` so that the anchor environment (onnx + onnxruntime, no
torch) can build it: ``python benchmarks/str_model.py OUT.onnx`` checks it with onnxruntime.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

STR_INPUT, STR_OUTPUT = "input.1", "308"
STR_SHAPE = (1, 32, 100)  # C, H, W: one grey text line
STR_CLASSES, STR_SEQ = 37, 24  # 36 characters + the CTC blank; width 100 -> 24 time steps
HIDDEN = 256


class _Graph:
    """Accumulates nodes and seeded random initializers; each op helper returns its output name."""

    def __init__(self, seed: int) -> None:
        from onnx import helper

        self.helper = helper
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}_{self.count}"

    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        name = self._name("w")
        self.inits[name] = (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
        return name

    def const(self, value: np.ndarray) -> str:
        name = self._name("c")
        self.inits[name] = value
        return name

    def op(self, kind: str, inputs: list[str], **attrs: object) -> str:
        out = self._name(kind.lower())
        self.nodes.append(self.helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv(self, x: str, cin: int, cout: int, k: int, pad: int, bias: bool = True) -> str:
        ins = [x, self.weight((cout, cin, k, k), cin * k * k)]
        if bias:
            ins.append(self.const(np.zeros(cout, np.float32)))
        return self.op("Conv", ins, kernel_shape=[k, k], pads=[pad] * 4)

    def batchnorm(self, x: str, c: int) -> str:
        ones, zeros = np.ones(c, np.float32), np.zeros(c, np.float32)
        return self.op(
            "BatchNormalization", [x, self.const(ones), self.const(zeros), self.const(zeros), self.const(ones)]
        )

    def pool(self, x: str, kh: int, kw: int) -> str:
        return self.op("MaxPool", [x], kernel_shape=[kh, kw], strides=[kh, kw])

    def linear(self, x: str, fan_in: int, fan_out: int) -> str:
        y = self.op("MatMul", [x, self.weight((fan_in, fan_out), fan_in)])
        return self.op("Add", [y, self.const(np.zeros(fan_out, np.float32))])

    def bilstm(self, x: str, fan_in: int, out: int) -> str:
        """nn.LSTM(bidirectional) then nn.Linear(2 * HIDDEN, out), on [seq, batch, fan_in]."""
        w = self.weight((2, 4 * HIDDEN, fan_in), fan_in)
        r = self.weight((2, 4 * HIDDEN, HIDDEN), HIDDEN)
        b = self.const(np.zeros((2, 8 * HIDDEN), np.float32))
        y = self.op("LSTM", [x, w, r, b], hidden_size=HIDDEN, direction="bidirectional")  # [seq, 2, batch, H]
        y = self.op("Transpose", [y], perm=[0, 2, 1, 3])  # [seq, batch, 2, H]
        y = self.op("Reshape", [y, self.const(np.array([0, 0, 2 * HIDDEN], np.int64))])
        return self.linear(y, 2 * HIDDEN, out)


def build_str(seed: int = 0) -> bytes:
    """The serialized ONNX model (opset 17, IR 8 so older onnxruntime builds load it too)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    g = _Graph(seed)
    x = g.op("Relu", [g.conv(STR_INPUT, 1, 64, 3, 1)])
    x = g.pool(x, 2, 2)  # 64 x 16 x 50
    x = g.pool(g.op("Relu", [g.conv(x, 64, 128, 3, 1)]), 2, 2)  # 128 x 8 x 25
    x = g.op("Relu", [g.conv(x, 128, 256, 3, 1)])
    x = g.pool(g.op("Relu", [g.conv(x, 256, 256, 3, 1)]), 2, 1)  # 256 x 4 x 25
    x = g.op("Relu", [g.batchnorm(g.conv(x, 256, 512, 3, 1, bias=False), 512)])
    x = g.op("Relu", [g.batchnorm(g.conv(x, 512, 512, 3, 1, bias=False), 512)])
    x = g.pool(x, 2, 1)  # 512 x 2 x 25
    x = g.op("Relu", [g.conv(x, 512, 512, 2, 0)])  # 512 x 1 x 24
    x = g.op("ReduceMean", [x], axes=[2], keepdims=0)  # AdaptiveAvgPool2d((None, 1)): [batch, 512, 24]
    x = g.op("Transpose", [x], perm=[2, 0, 1])  # [24, batch, 512]: sequence first for LSTM
    x = g.bilstm(x, 512, HIDDEN)
    x = g.bilstm(x, HIDDEN, HIDDEN)
    x = g.linear(x, HIDDEN, STR_CLASSES)  # [24, batch, 37]
    g.nodes.append(helper.make_node("Transpose", [x], [STR_OUTPUT], perm=[1, 0, 2]))
    graph = helper.make_graph(
        g.nodes,
        "str_vgg_bilstm_ctc",
        inputs=[helper.make_tensor_value_info(STR_INPUT, TensorProto.FLOAT, ["batch", *STR_SHAPE])],
        outputs=[helper.make_tensor_value_info(STR_OUTPUT, TensorProto.FLOAT, ["batch", STR_SEQ, STR_CLASSES])],
        initializer=[numpy_helper.from_array(v, name=k) for k, v in g.inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="shoal-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.write_bytes(build_str())
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    y = sess.run(None, {STR_INPUT: np.zeros((2, *STR_SHAPE), np.float32)})[0]
    assert y.shape == (2, STR_SEQ, STR_CLASSES), y.shape
    print(f"{out}: {out.stat().st_size} bytes, output {y.shape}")


if __name__ == "__main__":
    main()
