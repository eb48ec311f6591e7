"""The wire: everything that travels on the bus between Shoal's processes.

Every bus message is a msgspec Struct defined here (MessagePack, or JSON where its docstring says so):

- `messages.py`: the request path: requests, responses, batches, credits (docs/design.md §3);
- `control.py`: the control plane: load, unload, on-demand, index, drains, usage, figures, logging;
- `records.py`: the records kept in JetStream KV buckets (models, instances, shared-memory regions);
- `status.py`: what each service's NATS micro `status` endpoint answers (`shoal status`);
- `subjects.py`: every NATS subject and KV bucket name, built in one place;
- `statistics.py`: Triton's statistics document, which schedulers fill and gateways answer.

Every process imports these; they import msgspec and typing only, nothing else of Shoal's (how the
bytes of a tensor travel is `shared/bus/tensor_store.py`'s business).
"""
