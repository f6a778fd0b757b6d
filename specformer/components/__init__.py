"""Torch building blocks: attention, positional schemes, FFNs, norms, blocks, heads, models."""

from specformer.components.attention import Attention
from specformer.components.blocks import (
    OutputNormBlock,
    ParallelBlock,
    PostNormBlock,
    PreNormBlock,
    SandwichBlock,
    Stack,
)
from specformer.components.cache import CacheNotFilledError, KVCache
from specformer.components.embedding import Embedding
from specformer.components.ffn import GLU, MLP
from specformer.components.heads import ClassificationHead, LMHead, MLMHead
from specformer.components.layout import lay_out_for_decoding, restore_layout
from specformer.components.models import DecoderModel, EncoderDecoderModel, EncoderModel
from specformer.components.outputs import ModelOutput
from specformer.components.positional import (
    ALiBi,
    LearnedPositional,
    NoPositional,
    Positional,
    Rotary,
    SinusoidalPositional,
    T5RelativeBias,
)

__all__ = [
    "Attention",
    "OutputNormBlock",
    "ParallelBlock",
    "PostNormBlock",
    "PreNormBlock",
    "SandwichBlock",
    "Stack",
    "KVCache",
    "CacheNotFilledError",
    "Embedding",
    "GLU",
    "MLP",
    "ClassificationHead",
    "LMHead",
    "MLMHead",
    "lay_out_for_decoding",
    "restore_layout",
    "DecoderModel",
    "EncoderDecoderModel",
    "EncoderModel",
    "ModelOutput",
    "ALiBi",
    "LearnedPositional",
    "NoPositional",
    "Positional",
    "Rotary",
    "SinusoidalPositional",
    "T5RelativeBias",
]
