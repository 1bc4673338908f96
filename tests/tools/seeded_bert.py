"""Shared by the golden scripts that make seeded BERT checkpoints."""
import torch


def draw_norms_and_biases(model, heads=()):
    """Draws every LayerNorm scale in [0.5, 1.5] and every bias in [-0.2, 0.2] (the
    initializer leaves them 1 and 0, which would let a wrong norm or a dropped bias
    pass the tests), and the parameters whose names start with one of `heads` from
    N(0, 1). Uses torch's current seed."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm.weight" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                parameter.uniform_(-0.2, 0.2)
            elif name.startswith(tuple(heads)) and heads:
                parameter.normal_(0.0, 1.0)
    return model
