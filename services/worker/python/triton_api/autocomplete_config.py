"""The config object `TritonPythonModel.auto_complete_config` receives (`pb_utils.ModelConfig`)."""

from __future__ import annotations


class ModelConfig:
    """The config handed to `TritonPythonModel.auto_complete_config` (Triton's JSON form)."""

    def __init__(self, model_config: dict) -> None:
        self._config = model_config

    def as_dict(self) -> dict:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current not in (0, max_batch_size):
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._config.get('name', '')}' specified max_batch_size "
                f"{max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        if self._config.get("sequence_batching"):
            raise ValueError(
                f"Configuration specified scheduling_choice as 'sequence_batching', but "
                f"auto-complete-config function for model '{self._config.get('name', '')}' tries to "
                "set scheduling_choice as 'dynamic_batching'"
            )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: dict) -> None:
        self._add("input", input)

    def add_output(self, output: dict) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict) -> None:
        model = self._config.get("name", "")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{tensor.get('name', '')}' in auto-complete-config function for model "
                    f"'{model}' is missing '{key}' property."
                )
        existing = next((t for t in self._config.setdefault(kind, []) if t.get("name") == tensor["name"]), None)
        if existing is None:
            self._config[kind].append(dict(tensor))
            return
        for key in ("data_type", "dims"):  # what config.pbtxt states wins, but must agree
            stated = existing.get(key)
            if stated in (None, "", "TYPE_INVALID", []):
                existing[key] = tensor[key]
            elif list(stated) != list(tensor[key]) if key == "dims" else stated != tensor[key]:
                raise ValueError(
                    f"unable to load model '{model}', configuration expects {key} {stated} for "
                    f"{kind} '{tensor['name']}', model provides {tensor[key]}"
                )
