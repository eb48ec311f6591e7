"""A python-based backend with the shape of Triton's vLLM backend (src/model.py): every pb_utils
call that one makes, over a stand-in engine (utils/engine.py) instead of vLLM.

auto_complete_config (decoupled, max_batch_size 0, inputs and outputs added), the model
config and args, model.json read from pb_utils.get_model_dir(), an asyncio engine on a thread
of its own, a response thread sending through each request's response sender,
is_cancelled, MetricFamily counters and histograms, TritonError codes, a health check that
unloads the model (pb_utils.unload_model from execute), finalize.
"""

import asyncio
import json
import os
import queue
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
from utils.engine import build_engine  # the backend's own package, beside its model.py

_ENGINE_ARGS_FILENAME = "model.json"


class TritonPythonModel:
    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        inputs = [
            {"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
            {"name": "sampling_parameters", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
        ]
        outputs = [
            {"name": "text_output", "data_type": "TYPE_STRING", "dims": [-1]},
            {"name": "num_output_tokens", "data_type": "TYPE_UINT32", "dims": [-1]},
        ]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for tensor in inputs:
            if tensor["name"] not in input_names:
                auto_complete_model_config.add_input(tensor)
        for tensor in outputs:
            if tensor["name"] not in output_names:
                auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=True))
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def initialize(self, args):
        self.args = args
        self.logger = pb_utils.Logger
        self.model_config = json.loads(args["model_config"])
        output_config = pb_utils.get_output_config_by_name(self.model_config, "text_output")
        self.output_dtype = pb_utils.triton_string_to_numpy(output_config["data_type"])
        self._enable_health_check = self._get_bool_config_param("ENABLE_HEALTH_CHECK")
        self._is_healthy = True
        assert pb_utils.using_decoupled_model_transaction_policy(self.model_config), (
            "fakellm backend must be configured to use decoupled model transaction policy"
        )
        engine_args = os.path.join(pb_utils.get_model_dir(), _ENGINE_ARGS_FILENAME)
        assert os.path.isfile(engine_args), (
            f"'{_ENGINE_ARGS_FILENAME}' must be provided in '{pb_utils.get_model_dir()}'"
        )
        with open(engine_args) as file:
            self.engine_config = json.load(file)
        assert args["model_instance_kind"] in ("CPU", "GPU", "MODEL"), args
        int(args["model_instance_device_id"])
        self.repository = args["model_repository"]
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.metrics_enabled = self._get_bool_config_param("REPORT_CUSTOM_METRICS")
        if self.metrics_enabled:
            tokens = pb_utils.MetricFamily(
                name="fakellm:generation_tokens_total",
                description="Number of generation tokens processed.",
                kind=pb_utils.MetricFamily.COUNTER,
            )
            cancelled = pb_utils.MetricFamily(
                name="fakellm:cancelled_requests_total",
                description="Requests the client cancelled.",
                kind=pb_utils.MetricFamily.COUNTER,
            )
            per_request = pb_utils.MetricFamily(
                name="fakellm:request_generation_tokens",
                description="Number of generation tokens processed per request.",
                kind=pb_utils.MetricFamily.HISTOGRAM,
            )
            self.tokens = tokens.Metric(labels=labels)
            self.cancelled = cancelled.Metric(labels=labels)
            self.per_request = per_request.Metric(labels=labels, buckets=[1, 2, 5, 10, 20, 50])
        self._init_engine()
        self._response_queue = queue.Queue()
        self._response_thread = threading.Thread(target=self._response_loop)
        self._response_thread.start()

    def _get_bool_config_param(self, name):
        return name in self.model_config["parameters"] and (
            self.model_config["parameters"][name]["string_value"].lower() == "true"
        )

    def _init_engine(self):
        self._engine = None
        self._engine_started = threading.Condition()
        self._shutdown = None
        self._event_thread = threading.Thread(target=asyncio.run, args=(self._run_engine(),))
        self._event_thread.start()
        with self._engine_started:
            while self._engine is None:
                self._engine_started.wait()

    async def _run_engine(self):
        self._ongoing = 0
        self._shutdown = asyncio.Event()
        delay = float(self.engine_config.get("step_delay_s", 0.005))
        async with build_engine(delay, bool(self.engine_config.get("healthy", True))) as engine:
            self._event_loop = asyncio.get_running_loop()
            with self._engine_started:
                self._engine = engine
                self._engine_started.notify_all()
            await self._shutdown.wait()
            while self._ongoing > 0:
                await asyncio.sleep(0.01)

    def _response_loop(self):
        while True:
            item = self._response_queue.get()
            if item is None:
                break
            state, response, flags = item
            sender = state["response_sender"]
            try:
                sender.send(response, flags)
                if not state["last_response_generated"]:
                    state["is_cancelled"] = sender.is_cancelled()
            except Exception as exc:
                self.logger.log_error(f"[fakellm] An error occurred while sending a response: {exc}")
            finally:
                if flags == pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                    self._ongoing -= 1

    def execute(self, requests):
        if self._enable_health_check and not self._check_health(requests):
            return None
        for request in requests:
            assert not self._shutdown.is_set(), "Cannot create tasks after shutdown has been requested"
            asyncio.run_coroutine_threadsafe(self._infer(request), self._event_loop)
        return None

    def _check_health(self, requests):
        future = asyncio.run_coroutine_threadsafe(self._engine.check_health(), self._event_loop)
        try:
            future.result()
        except Exception as exc:
            self.logger.log_error(f"[fakellm] Engine is not healthy and model will be unloaded: {exc}")
            pb_utils.unload_model(self.model_config["name"])  # non-blocking
            self._is_healthy = False
        if not self._is_healthy:
            for request in requests:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            message="Model is unavailable due to unhealthy engine",
                            code=pb_utils.TritonError.UNAVAILABLE,
                        )
                    ),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return self._is_healthy

    def _parameters(self, request):
        tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
        if tensor:
            return json.loads(tensor.as_numpy()[0].decode("utf-8"))
        return json.loads(request.parameters())

    async def _infer(self, request):
        response_sender = request.get_response_sender()
        state = {"response_sender": response_sender, "is_cancelled": False, "last_response_generated": False}
        self._ongoing += 1
        decrement = True
        try:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            prompt = prompt.decode("utf-8") if isinstance(prompt, bytes) else str(prompt)
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            stream = bool(stream.as_numpy()[0]) if stream is not None else False
            max_tokens = int(self._parameters(request).get("max_tokens", 4))
            last = None
            async for output in self._engine.generate(prompt, request.request_id() or str(id(request)), max_tokens):
                cancelled = state["is_cancelled"] if stream else response_sender.is_cancelled()
                if cancelled:
                    await self._engine.abort(output.request_id)
                    if self.metrics_enabled:
                        self.cancelled.increment(1)
                    if stream:
                        state["last_response_generated"] = True
                        error = pb_utils.TritonError(
                            message="Request was cancelled", code=pb_utils.TritonError.CANCELLED
                        )
                        decrement = False
                        self._response_queue.put_nowait(
                            (
                                state,
                                pb_utils.InferenceResponse(error=error),
                                pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                            )
                        )
                    break
                last = output
                if self.metrics_enabled:
                    self.tokens.increment(1)
                if stream:
                    flags = 0
                    if output.finished:
                        state["last_response_generated"] = True
                        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                        decrement = False
                    text = output.text.split(" ")[-1]
                    self._response_queue.put_nowait((state, self._response(text, 1), flags))
            if last is not None and self.metrics_enabled:
                self.per_request.observe(last.token_count)
            if not stream and last is not None and not state["last_response_generated"]:
                response_sender.send(
                    self._response(last.text, last.token_count), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        except Exception as exc:
            self.logger.log_error(f"[fakellm] Error generating stream: {exc}")
            error = pb_utils.TritonError(f"Error generating stream: {exc}")
            text = pb_utils.Tensor("text_output", np.asarray(["N/A"], dtype=self.output_dtype))
            response_sender.send(
                pb_utils.InferenceResponse(output_tensors=[text], error=error),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            if decrement:
                self._ongoing -= 1

    def _response(self, text, count):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=self.output_dtype)),
                pb_utils.Tensor("num_output_tokens", np.asarray([count], dtype=np.uint32)),
            ]
        )

    def finalize(self):
        self.logger.log_info("[fakellm] Issuing finalize to fakellm backend")
        self._event_loop.call_soon_threadsafe(self._shutdown.set)
        self._event_thread.join()
        self._response_queue.put(None)
        self._response_thread.join()
