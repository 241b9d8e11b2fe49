"""The project's tiny model: a ~1.8M-parameter Qwen2 with its own tokenizer, for CPU runs.

- ``intellect_node.node.models.tiny.build``: the recipe (``TinyRecipe``, ``DEFAULT_RECIPE``), tokenizer and model
  construction, the supervised warm-up on toy tasks (stopped by the demo's measured start accuracy),
  ``greedy_accuracy`` and ``ensure_tiny_model``.

``ensure_tiny_model(path)`` builds the model at ``path`` on first use (two to three minutes on two
cores) and returns the path on every later call; the result is an ordinary HF-layout directory
(config.json, model.safetensors, tokenizer.json) that any engine or trainer loads.
Run ``python -m intellect_node.node.models.tiny PATH`` to build one and print its greedy accuracy.
"""

from intellect_node.node.models.tiny.build import DEFAULT_RECIPE, TinyRecipe, ensure_tiny_model, tiny_model_dir

__all__ = ["DEFAULT_RECIPE", "TinyRecipe", "ensure_tiny_model", "tiny_model_dir"]
