"""The wire: everything that travels on the bus between Shoal's processes.

Every bus message is a msgspec Struct defined here (MessagePack, or JSON where its docstring says so):

- `messages.py`: the request path: requests, responses, batches, credits (docs/design.md §3);
- `control.py`: the control plane: load, unload, on-demand, index, drains, usage, figures, logging;
- `records.py`: the records kept in JetStream KV buckets (models, instances, shared-memory regions);
- `status.py`: what each service's NATS micro `status` endpoint answers (`shoal status`);
- `subjects.py`: every NATS subject and KV bucket name, built in one place;
- `tensors.py`: how tensor bytes travel: inline, POSIX shared memory handles, or chunks over the bus;
- `statistics.py`: Triton's statistics document, which schedulers fill and gateways answer.

Every process imports these; they import nothing from `services/` or `shoal/`.
"""
