"""``kpca-attention pap-trace``: what PAP does inside a model's RPC-Attention layers, over data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import torch
import typer

from ..io import check_output
from . import set_threads
from .kpca import check_options

__all__ = ["pap_trace_cmd"]


def pap_trace_cmd(
    model: Annotated[str, typer.Argument(help="checkpoint / run directory, or a registered model name")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for report.md, pap_trace.json, plots")],
    images: Annotated[Path | None, typer.Option("--images", help="folder of images")] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="image dataset (fashion-mnist, ...)")
    ] = None,
    texts: Annotated[Path | None, typer.Option("--texts", help="text file, one text per line (LMs)")] = None,
    split: Annotated[str, typer.Option(help="dataset split")] = "test",
    data_root: Annotated[str | None, typer.Option("--data-root", help="dataset root folder")] = None,
    max_samples: Annotated[int, typer.Option(help="trace at most this many inputs")] = 512,
    batch_size: Annotated[int, typer.Option(help="inputs per forward pass")] = 64,
    threads: Annotated[int | None, typer.Option(help="CPU threads (1 is fastest on a busy machine)")] = None,
) -> None:
    """PAP trace of every RPC-Attention layer of MODEL over data: is the sparse component ever active,
    tau vs max|K|, residuals, dual norm, convergence (writes report.md, pap_trace.json, PNG plots)."""
    from ..kpca.pap_trace import lm_text_batches, trace_model, trace_statement
    from ..report.pap_trace import write_trace_report

    check_options(max_samples=max_samples, batch_size=batch_size, threads=threads, split=split, texts=texts,
                   images=images, dataset=dataset)
    check_output(out, "--out", folder=True)
    set_threads(threads)
    path = Path(model).expanduser()
    base = model.partition("@")[0] if not path.exists() else model  # NAME@/absolute/weights is a name
    if ("/" in base or base.startswith(".")) and not path.exists():
        raise FileNotFoundError(f"no such checkpoint, run directory or model folder: {model} (a name without "
                                "'/' is looked up as a registered model)")
    from ..kpca.load import load_for_analysis
    from ..kpca.run import resolve_inputs

    loaded = load_for_analysis(model, pretrained=False)
    if loaded.takes_text and not loaded.project_tokens:
        raise ValueError(f"{model} is a text model without RPC layers of this project")
    inputs = resolve_inputs(loaded, texts=texts, images=images, dataset=dataset, split=split,
                            data_root=data_root, max_samples=max_samples)
    net, desc = loaded.model, inputs.description
    if inputs.texts is not None:  # a project LM: one window per text, in its own vocabulary
        batches = lm_text_batches(net, inputs.texts, batch_size)
    elif inputs.tokens is not None:
        batches = list(inputs.tokens.split(batch_size))
    else:
        x = inputs.images
        if loaded.normalize is not None:  # timm models normalise outside
            mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in loaded.normalize)
            x = (x - mean) / std
        batches = list(x.split(batch_size))
    trace = trace_model(net, batches, progress=True)
    report = write_trace_report(trace, out, title=f"PAP trace of {model}", source=model, inputs=desc)
    typer.echo(trace_statement(trace))
    typer.echo(report)
