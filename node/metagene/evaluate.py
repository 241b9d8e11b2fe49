"""Evaluation as METAGENE-1 evaluates, offline: held-out read perplexity per organism, and a
pathogen-detection analogue (name a read's source organism from the model's mean-pooled
embeddings with a linear probe, reported as MCC) against a k-mer frequency baseline on the same
reads and the same split.

Reads are scored alone (one read per row, no packing) so a read's perplexity never depends on its
neighbours. The probe split is deterministic: within each organism, reads alternate train/test
in input order. The baseline is the same probe on normalised 4-mer counts (256 features), the
classic composition classifier: a model's embeddings are worth something for detection only
where they beat it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from intellect_node.node.metagene.dataset import tokenize_reads
from intellect_node.node.metagene.probe import fit_probe, matthews_corrcoef, predict
from intellect_node.node.metagene.reads import Read
from intellect_node.node.metagene.sequences import IGNORE, build_rows

KMER = 4


@torch.no_grad()
def score_reads(model: LlamaForCausalLM, reads: Sequence[np.ndarray], seq_len: int = 512,
                batch: int = 64) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """Per read: summed next-token NLL (the EOS target included), target count, and the mean of
    the last hidden state over the read's positions."""
    model.eval()
    nll, counts, pooled = [], [], []
    for start in range(0, len(reads), batch):
        chunk = [r[:seq_len] for r in reads[start:start + batch]]
        rows = build_rows(chunk, max(len(r) for r in chunk), pack=False)  # pad to the longest, not seq_len
        out = model(**rows.model_inputs(), output_hidden_states=True)
        logits = out.logits.float()
        keep = rows.labels != IGNORE
        token_nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), rows.labels.clamp_min(0),
                                                      reduction="none")
        nll.append((token_nll * keep).sum(1))
        counts.append(keep.sum(1))
        inside = (rows.document_ids >= 0).unsqueeze(-1).float()
        hidden = out.hidden_states[-1].float()
        pooled.append((hidden * inside).sum(1) / inside.sum(1))
    return torch.cat(nll).numpy(), torch.cat(counts).numpy(), torch.cat(pooled)


def kmer_features(sequences: Sequence[str], k: int = KMER) -> torch.Tensor:
    """Normalised counts of every k-mer over ACGT (k-mers with N are skipped)."""
    index = {"".join(p): i for i, p in enumerate(itertools.product("ACGT", repeat=k))}
    out = torch.zeros(len(sequences), len(index))
    for row, seq in enumerate(sequences):
        for j in range(len(seq) - k + 1):
            col = index.get(seq[j:j + k])
            if col is not None:
                out[row, col] += 1
        out[row] /= out[row].sum().clamp_min(1)
    return out


def probe_split(labels: Sequence[int]) -> tuple[list[int], list[int]]:
    """Train/test indices: within each class, alternate reads in input order."""
    seen: dict[int, int] = {}
    train, test = [], []
    for i, label in enumerate(labels):
        (train if seen.get(label, 0) % 2 == 0 else test).append(i)
        seen[label] = seen.get(label, 0) + 1
    return train, test


def probe_mcc(features: torch.Tensor, labels: Sequence[int], classes: int) -> float:
    """MCC on the test half of a probe fitted on the train half."""
    train, test = probe_split(labels)
    y = torch.as_tensor(labels)
    probe = fit_probe(features[train], y[train], classes)
    return matthews_corrcoef(y[test], predict(probe, features[test]), classes)


def evaluate(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, reads: Sequence[Read],
             seq_len: int = 512) -> dict[str, Any]:
    """The metrics above on ``reads`` (their ``source`` is the organism). Needs two organisms and
    at least two reads of each."""
    store = tokenize_reads(reads, tokenizer, max_read_tokens=seq_len)
    labels = [int(s) for s in store.sources]
    classes = len(store.source_names)
    per_class = np.bincount(labels, minlength=classes)
    if classes < 2 or per_class.min() < 2:
        raise ValueError(f"evaluation needs >= 2 organisms with >= 2 reads each; "
                         f"got {dict(zip(store.source_names, per_class.tolist(), strict=True))}")
    nll, counts, pooled = score_reads(model, [store.read(i) for i in range(len(store))], seq_len)
    perplexity = {name: math.exp(nll[np.asarray(labels) == c].sum() / counts[np.asarray(labels) == c].sum())
                  for c, name in enumerate(store.source_names)}
    bp = sum(len(r.sequence) for r in reads)
    return {
        "reads": len(store),
        "organisms": store.source_names,
        "perplexity": perplexity,
        "perplexity_all": math.exp(nll.sum() / counts.sum()),
        "bits_per_bp": float(nll.sum() / math.log(2) / bp),
        "probe_mcc": probe_mcc(pooled, labels, classes),
        "kmer_mcc": probe_mcc(kmer_features([r.sequence for r in reads]), labels, classes),
    }
