"""A linear probe (multinomial logistic regression) and the multi-class Matthews correlation.

Why our own: a few lines of torch replace a scikit-learn dependency, and the probe must be
deterministic (full-batch L-BFGS from zero weights, standardised features), so the same
embeddings give the same MCC on every machine.
"""

from __future__ import annotations

import torch


def fit_probe(features: torch.Tensor, labels: torch.Tensor, classes: int, l2: float = 1e-3,
              iterations: int = 100) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(weight, bias, mean, std)`` of a softmax classifier on standardised ``features``."""
    x = features.double()
    mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
    x = (x - mean) / std
    weight = torch.zeros(x.shape[1], classes, dtype=torch.double, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.double, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ weight + bias, labels) + l2 * weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return weight.detach(), bias.detach(), mean, std


def predict(probe: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
            features: torch.Tensor) -> torch.Tensor:
    weight, bias, mean, std = probe
    return (((features.double() - mean) / std) @ weight + bias).argmax(-1)


def matthews_corrcoef(truth: torch.Tensor, predicted: torch.Tensor, classes: int) -> float:
    """Gorodkin's multi-class MCC (as scikit-learn's ``matthews_corrcoef``): 1 perfect, 0 chance."""
    confusion = torch.zeros(classes, classes, dtype=torch.double)
    confusion.index_put_((truth, predicted), torch.ones(len(truth), dtype=torch.double), accumulate=True)
    total = confusion.sum()
    correct = confusion.trace()
    true_counts, pred_counts = confusion.sum(1), confusion.sum(0)
    numerator = correct * total - (true_counts * pred_counts).sum()
    denominator = torch.sqrt((total**2 - (pred_counts**2).sum()) * (total**2 - (true_counts**2).sum()))
    return float(numerator / denominator) if denominator > 0 else 0.0
