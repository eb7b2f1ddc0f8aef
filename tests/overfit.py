"""Overfitting the tiny model on one sequence, for tests that need a model which reliably says one thing."""

import torch


def overfit(model, sequence: torch.Tensor, labels: torch.Tensor, what: str, max_steps: int = 400) -> None:
    """Adam at lr 3e-3 on ``sequence`` (``labels`` -100 where not learned) until the loss is below 0.005;
    seeded and on one thread, so every run learns the same weights."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        for _ in range(max_steps):
            loss = model(input_ids=sequence, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.005:
                break
    torch.set_num_threads(previous)
    assert loss.item() < 0.005, f"{what} did not converge (loss {loss.item():.4f})"
