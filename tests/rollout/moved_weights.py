"""A model with every weight moved at random: the actor after some training, for the weight-sync tests."""

import torch

from hybridflow.models.loading import load_causal_lm


def moved_model(model_dir, seed: int = 1, scale: float = 0.05) -> torch.nn.Module:
    """The model of ``model_dir`` with ``scale`` times a standard normal (seeded) added to every weight."""
    model = load_causal_lm(model_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
    return model
