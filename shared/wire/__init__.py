"""The wire: everything that travels on the bus between Shoal's processes.

- `messages.py`: every bus message, a msgspec Struct encoded as MessagePack (docs/design.md §3);
- `subjects.py`: every NATS subject and KV bucket name, built in one place;
- `tensors.py`: how tensor bytes travel: inline, POSIX shared memory handles, or chunks over the bus;
- `statistics.py`: Triton's statistics document, which schedulers fill and gateways answer.

Every process imports these; they import nothing from `services/` or `shoal/`.
"""
