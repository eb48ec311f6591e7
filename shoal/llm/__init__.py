"""Language models served by a python model: llama.cpp with continuous batching.

- `llama_c_api.py`: llama.cpp's C API (llama.h) through llama-cpp-python's ctypes bindings: load a
  GGUF file, tokenize, decode a batch of several sequences, sample per sequence.
- `probe.py`: loads the library and the model and generates in a child process first, and picks
  the CPU backend of a portable build that runs here, so that a library that cannot run on this
  CPU (SIGILL) fails the model's load with the reason instead of killing its process.
- `engine.py`: the continuous batcher: many sequences decode together in one context, new
  ones join between steps, finished or cancelled ones leave at once, within bounds on
  sequences and context cells.
- `text.py`: chat templates and incremental detokenization.
- `python_model.py`: the Triton python-backend model (`TritonPythonModel`) over all of these.

The example model `smollm2-135m-instruct` (services/repository/llm_examples.py) is a thin
`model.py` over these; docs/openai.md says how it batches and what it measures.
"""
