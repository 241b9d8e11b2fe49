"""The project's tiny model: a ~1.8M-parameter Qwen2 with its own tokenizer, for CPU runs.

- ``intellect_node.node.models.tiny.build``: the recipe (``TinyRecipe``, ``DEFAULT_RECIPE``), tokenizer and model
  construction, the supervised warm-up on toy tasks (stopped by the demo's measured start accuracy),
  ``greedy_accuracy`` and ``ensure_tiny_model``.
- ``intellect_node.node.models.tiny.shipped``: the default recipe's weights as shipped in ``weights/`` (one
  build, the same bytes on every machine) and their install, checked file by file against recorded hashes.

``ensure_tiny_model(path)`` puts the default model at ``path`` on first use (a copy of the shipped weights, under
a second) or builds another recipe there (two to three minutes on two cores for a full one), and returns the path
on every later call; the result is an ordinary HF-layout directory (config.json, model.safetensors,
tokenizer.json) that any engine or trainer loads. Run ``python -m intellect_node.node.models.tiny PATH`` to
install one (``--rebuild``: build it from the recipe) and print its greedy accuracy.
"""

from intellect_node.node.models.tiny.build import DEFAULT_RECIPE, TinyRecipe, ensure_tiny_model, tiny_model_dir

__all__ = ["DEFAULT_RECIPE", "TinyRecipe", "ensure_tiny_model", "tiny_model_dir"]
