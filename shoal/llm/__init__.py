"""Language models served by a python model: llama.cpp with continuous batching.

- `runtime.py`: llama.cpp's C API (llama.h) through the prebuilt `llama-cpp-py-sync` wheel:
  load a GGUF file, tokenize, decode a batch of several sequences, sample per sequence.
- `probe.py`: loads the library and the model and generates in a child process first, so that
  a library that cannot run on this CPU (SIGILL) fails the model's load with the reason.
- `engine.py`: the continuous batcher: many sequences decode together in one context, new
  ones join between steps, finished or cancelled ones leave at once, within bounds on
  sequences and context cells.
- `text.py`: chat templates and incremental detokenization.

The example model `smollm2-135m-instruct` (services/repository/llm_examples.py) is a thin
`model.py` over these; docs/openai.md says how it batches and what it measures.
"""
