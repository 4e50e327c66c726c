"""The trainer's models, built by name for any input shape: a registry dict behind ``register``/``build_model``.

Inputs are ``(C, H, W)`` images or ``(F,)`` feature vectors; convolutional models see a feature vector
as a ``1 x 1 x F`` image, so every such model runs on every image or vector data set. The models in
``TOKEN_MODELS`` instead take token windows ``(T,)`` (``num_classes`` = vocabulary) and return a prediction per
position: they train on the token data sets (``data.TOKEN_DATASETS``) only.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .gpt import GPT

ModelBuilder = Callable[..., nn.Module]
MODELS: dict[str, ModelBuilder] = {}


def register(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    def add(builder: ModelBuilder) -> ModelBuilder:
        MODELS[name] = builder
        return builder

    return add


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **opts) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` (without the batch dimension)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (valid: {', '.join(MODELS)})")
    return MODELS[name](tuple(input_shape), num_classes, **opts)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def grad_bytes(model: nn.Module) -> int:
    """Bytes of one full gradient (what data-parallel training must average every step)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _as_image(input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    if len(input_shape) == 3:
        return input_shape  # type: ignore[return-value]
    if len(input_shape) == 1:
        return (1, 1, input_shape[0])
    raise ValueError(f"inputs must be (C, H, W) or (F,), got {input_shape}")


class _ToImage(nn.Module):
    """Reshape a batch of inputs to ``(N, C, H, W)``."""

    def __init__(self, image_shape: tuple[int, int, int]):
        super().__init__()
        self.image_shape = image_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], *self.image_shape)


def _pool(h: int, w: int) -> nn.Module:
    """2x2 max pooling along each axis that is still at least 2 long (so 1-pixel-high inputs work)."""
    return nn.MaxPool2d(kernel_size=(min(2, h), min(2, w)))


def _flat_size(features: nn.Module, image_shape: tuple[int, int, int]) -> int:
    with torch.no_grad():
        return features(torch.zeros(1, *image_shape)).numel()


@register("mlp")
def build_mlp(input_shape, num_classes, *, hidden: int = 128, **_) -> nn.Module:
    """Two hidden ReLU layers of width ``hidden`` (scale ``hidden`` up for communication-bound runs)."""
    n_in = 1
    for d in input_shape:
        n_in *= d
    return nn.Sequential(nn.Flatten(), nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, num_classes))


@register("lenet")
def build_lenet(input_shape, num_classes, **_) -> nn.Module:
    """LeNet-like: two conv(3x3)+ReLU+pool stages (6 and 16 channels), then 120-84-classes."""
    c, h, w = image = _as_image(input_shape)
    pool1 = _pool(h, w)
    h1, w1 = h // min(2, h), w // min(2, w)
    features = nn.Sequential(_ToImage(image), nn.Conv2d(c, 6, 3, padding=1), nn.ReLU(), pool1,
                             nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(), _pool(h1, w1), nn.Flatten())
    flat = _flat_size(features, image)
    return nn.Sequential(features, nn.Linear(flat, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                         nn.Linear(84, num_classes))


@register("bncnn")
def build_bncnn(input_shape, num_classes, **_) -> nn.Module:
    """A small CNN with BatchNorm (the model of a DDP tutorial): two conv(3x3)+BN+ReLU+pool stages (16 and 32
    channels), then a linear classifier. Its running statistics are what ``--buffers`` keeps identical."""
    c, h, w = image = _as_image(input_shape)
    h1, w1 = h // min(2, h), w // min(2, w)
    features = nn.Sequential(_ToImage(image), nn.Conv2d(c, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                             nn.ReLU(), _pool(h, w), nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32),
                             nn.ReLU(), _pool(h1, w1), nn.Flatten())
    return nn.Sequential(features, nn.Linear(_flat_size(features, image), num_classes))


class BasicBlock(nn.Module):
    """Two 3x3 conv+BN layers with an identity (or 1x1 projection) shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


@register("resnet20")
def build_resnet20(input_shape, num_classes, **_) -> nn.Module:
    """CIFAR-style ResNet-20 (He et al. 2016): 3 stages x 3 basic blocks (16, 32, 64 channels), global pool."""
    c = _as_image(input_shape)[0]
    layers: list[nn.Module] = [_ToImage(_as_image(input_shape)), nn.Conv2d(c, 16, 3, padding=1, bias=False),
                               nn.BatchNorm2d(16), nn.ReLU()]
    c_in = 16
    for stage, c_out in enumerate((16, 32, 64)):
        for block in range(3):
            layers.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and block == 0 else 1))
            c_in = c_out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    return nn.Sequential(*layers)


@register("alexnet")
def build_alexnet(input_shape, num_classes, **_) -> nn.Module:
    """AlexNet-like and communication-heavy: five small convs, then two large fully connected layers, 4096 wide
    (AlexNet's) for inputs of 32x32 pixels or more, 2048 below."""
    c, h, w = image = _as_image(input_shape)
    fc = 4096 if h * w >= 32 * 32 else 2048
    h1, w1 = h // min(2, h), w // min(2, w)
    features = nn.Sequential(
        _ToImage(image),
        nn.Conv2d(c, 64, 3, padding=1), nn.ReLU(), _pool(h, w),
        nn.Conv2d(64, 192, 3, padding=1), nn.ReLU(), _pool(h1, w1),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(),
        nn.AdaptiveMaxPool2d((2, 2)), nn.Flatten(),
    )
    flat = _flat_size(features, image)
    return nn.Sequential(features, nn.Dropout(0.5), nn.Linear(flat, fc), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(fc, fc), nn.ReLU(), nn.Linear(fc, num_classes))


@register("gpt")
def build_gpt(input_shape, num_classes, **_) -> nn.Module:
    """A character-level GPT (``gpt``): 2 pre-LayerNorm blocks, 4 heads, width 128 (about 0.4 M parameters), context
    ``input_shape[0]``, vocabulary ``num_classes``; logits ``(B, T, num_classes)``."""
    if len(input_shape) != 1:
        raise ValueError(f"gpt takes token windows (T,), got inputs of shape {input_shape}")
    return GPT(num_classes, context=input_shape[0])


# Models of token windows with a prediction per position (the config pairs them with data.TOKEN_DATASETS).
TOKEN_MODELS = ("gpt",)
