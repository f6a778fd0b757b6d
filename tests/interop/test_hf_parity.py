"""Parity with Hugging Face transformers on tiny random models, per supported family.

transformers builds each model from a config with random weights (no network); we
import its config and weights, and check logits (hidden states for encoders), greedy
generation with the KV cache, and that an export loads back into transformers.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="the [hf] extra (transformers) is not installed: pip install 'specformer[hf]'"
)

from specformer.builder import build_model  # noqa: E402
from specformer.interop.hf import (  # noqa: E402
    HFConversionError,
    import_hf,
    load_hf_weights,
    read_hf_state_dict,
    save_hf,
    to_hf,
)
from specformer.interop.hf_config import hf_config_from_spec, spec_from_hf_config  # noqa: E402
from specformer.interop.hf_weights import hf_to_specformer, specformer_to_hf  # noqa: E402
from specformer.specs.loader import load_spec  # noqa: E402

pytestmark = pytest.mark.reference

V = 101  # vocabulary of the tiny models
_SMALL = {"vocab_size": V, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}

# model_type -> kwargs of a tiny config; each exercises the family's distinctive parts
TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    # GPT-BigCode: GPT-2 with one key/value head and linear layers; and with a key/value head
    # per query head (GPT-2's structure, its own names), untied
    "gpt_bigcode": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64},
    "gpt_bigcode-mha": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "multi_query": False,
                        "tie_word_embeddings": False},
    # OPT: positions offset by 2, separate q/k/v, ReLU; post-norm without a final norm and
    # untied; and pre-norm without the final norm, biases or ReLU
    "opt": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
            "max_position_embeddings": 64, "word_embed_proj_dim": 32},
    "opt-post": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 48,
                 "max_position_embeddings": 64, "word_embed_proj_dim": 32, "do_layer_norm_before": False,
                 "tie_word_embeddings": False},
    "opt-bare": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "ffn_dim": 64,
                 "max_position_embeddings": 64, "word_embed_proj_dim": 32, "_remove_final_layer_norm": True,
                 "enable_bias": False, "activation_function": "gelu"},
    "bert": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 64, "max_position_embeddings": 64},
    # untied, transformers 5 computes with the decoder's own bias (the head's `bias` is unused)
    "bert-untied": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                    "intermediate_size": 64, "max_position_embeddings": 64, "tie_word_embeddings": False},
    "roberta-untied": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                       "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
                       "layer_norm_eps": 1e-5, "pad_token_id": 1, "tie_word_embeddings": False},
    "roberta": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
                "layer_norm_eps": 1e-5, "pad_token_id": 1},
    # sequence classification (`-cls`): BERT's pooler + classifier, RoBERTa's classifier.dense + out_proj
    "bert-cls": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 64, "max_position_embeddings": 64, "num_labels": 3,
                 "classifier_dropout": 0.2},
    "roberta-cls": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                    "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
                    "layer_norm_eps": 1e-5, "pad_token_id": 1,
                    "id2label": {0: "negative", 1: "neutral", 2: "positive", 3: "mixed"}},
    # XLM-RoBERTa is RoBERTa's model under another name (and class names)
    "xlm-roberta": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
                    "layer_norm_eps": 1e-5, "pad_token_id": 1},
    "xlm-roberta-cls": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                        "intermediate_size": 64, "max_position_embeddings": 66, "type_vocab_size": 1,
                        "layer_norm_eps": 1e-5, "pad_token_id": 1, "num_labels": 2},
    # DistilBERT: BERT's layer without token types, its own names; relu and untied below
    "distilbert": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 64},
    "distilbert-untied": {"dim": 32, "n_layers": 1, "n_heads": 4, "hidden_dim": 48, "max_position_embeddings": 64,
                          "activation": "relu", "tie_word_embeddings": False},
    # its pre_classifier: BERT's pooler with relu in place of tanh
    "distilbert-cls": {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64, "max_position_embeddings": 64,
                       "id2label": {0: "negative", 1: "positive"}, "seq_classif_dropout": 0.1},
    "t5": {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
           "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16},
    "t5-v1_1": {"d_model": 32, "d_kv": 16, "d_ff": 48, "num_layers": 2, "num_heads": 3,
                "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    # mT5 is T5 v1.1's model (gated-gelu by default) that never scales the decoder output;
    # MT5Config always says tie_word_embeddings: true, `-untied` has an lm_head of its own
    # as the released mT5 checkpoints do
    "mt5": {"d_model": 32, "d_kv": 16, "d_ff": 48, "num_layers": 2, "num_heads": 3},
    "mt5-untied": {"d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 1, "num_heads": 4},
    "bart": {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
             "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 48,
             "max_position_embeddings": 64, "activation_function": "gelu", "forced_eos_token_id": None,
             "decoder_start_token_id": 2},
    "bart-scaled": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 4,
                    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                    "max_position_embeddings": 64, "activation_function": "relu", "scale_embedding": True,
                    "forced_eos_token_id": None, "decoder_start_token_id": 2},
    # untied, transformers 5 gives each stack a token table of its own (`shared` is unused):
    # the spec then has embedding.share_encoder_decoder: false
    "bart-untied": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
                    "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                    "max_position_embeddings": 64, "forced_eos_token_id": None, "decoder_start_token_id": 2,
                    "tie_word_embeddings": False},
    # Marian: BART's layers with fixed sinusoids in halves, embeddings scaled, an output bias;
    # and untied (a token table per stack, as transformers 5 has it)
    "marian": {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
               "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 48,
               "max_position_embeddings": 64, "scale_embedding": True, "activation_function": "swish",
               "decoder_start_token_id": 0, "forced_eos_token_id": None},
    "marian-untied": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 4,
                      "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                      "max_position_embeddings": 64, "activation_function": "relu", "decoder_start_token_id": 0,
                      "forced_eos_token_id": None, "tie_word_embeddings": False},
    "llama": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
              "rope_theta": 500.0, "rms_norm_eps": 1e-5},
    # scaled rotary frequencies: head_dim 16 over rope_theta 500 has wavelengths 6.3 to 1442,
    # so Llama 3's three bands (kept below 16 / 2, interpolated above 16 / 1, blended between)
    # all hold some, and YaRN's ramp runs over the middle ones
    "llama-llama3": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64,
                     "rms_norm_eps": 1e-5,
                     "rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 4.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 2.0,
                                         "original_max_position_embeddings": 16}},
    "llama-yarn": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "intermediate_size": 64, "max_position_embeddings": 64,
                   "rope_parameters": {"rope_type": "yarn", "rope_theta": 500.0, "factor": 4.0,
                                       "original_max_position_embeddings": 16}},
    # dynamic NTK past an original context of 20: greedy decoding's prompt and 20 new tokens
    # reach 27, so its cached steps past 20 grow the base each (beam search stays within 17)
    "llama-dynamic": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 20,
                      "rope_parameters": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0}},
    # LongRoPE past an original context of 20 (greedy decoding switches to the long factors
    # at its 14th step); the factor from the two lengths, 3.2, sets the attention factor
    "llama-longrope": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64,
                       "rope_parameters": {"rope_type": "longrope", "rope_theta": 500.0,
                                           "original_max_position_embeddings": 20,
                                           "short_factor": [1.0, 1.1, 1.0, 1.3, 1.2, 1.5, 2.0, 1.9],
                                           "long_factor": [1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 9.0, 12.0]}},
    "mistral": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64,
                "sliding_window": 5, "head_dim": 16},
    # Qwen2: biases on q, k and v but not on the output projection
    "qwen2": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
              "rope_theta": 500.0},
    # and a window in the layers from max_window_layers on, tied
    "qwen2-window": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "intermediate_size": 48, "max_position_embeddings": 64,
                     "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2,
                     "tie_word_embeddings": True},
    # Qwen3: an RMSNorm over each query and key head before the rotation, a head_dim of its own
    "qwen3": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
              "max_position_embeddings": 64, "rope_theta": 500.0},
    # and a window in the layers from max_window_layers on, tied, with attention biases (its
    # query and key norms take rms_norm_eps, here 1e-5)
    "qwen3-window": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 48,
                     "max_position_embeddings": 64, "use_sliding_window": True, "sliding_window": 5,
                     "max_window_layers": 1, "tie_word_embeddings": True, "attention_bias": True,
                     "rms_norm_eps": 1e-5},
    # Phi-3: q, k, v in one matrix, gate and up in another
    "phi3": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
             "rope_theta": 500.0},
    # and a window on every layer, tied, rotating half of each head (Phi-4-mini rotates 75%)
    "phi3-partial": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 1, "intermediate_size": 48, "max_position_embeddings": 64,
                     "sliding_window": 5, "tie_word_embeddings": True, "partial_rotary_factor": 0.5},
    # and LongRoPE past an original context of 16 (Phi-3.5's), which Phi-3's config keeps beside
    # its rope_parameters: an export must write it there (else transformers reads 4096)
    "phi3-longrope": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                      "num_key_value_heads": 1, "intermediate_size": 48, "max_position_embeddings": 64,
                      "original_max_position_embeddings": 16, "partial_rotary_factor": 0.5,
                      "rope_parameters": {"rope_type": "longrope", "rope_theta": 500.0,
                                          "short_factor": [1.0, 1.1, 1.2, 1.3],
                                          "long_factor": [2.0, 2.1, 2.2, 2.3]}},
    # Gemma: RMSNorm gains of 1 + weight, embeddings scaled by sqrt(hidden_size), GELU (tanh)
    # gates under its legacy name, multi-query attention with a wider head, tied
    "gemma": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64,
              "max_position_embeddings": 64, "hidden_act": "gelu"},
    # Phi-1/1.5/2: one LayerNorm feeding a parallel block, 40% rotary (Phi-2's share), biases,
    # a biased LM head; and with grouped-query attention, tied (the head keeps its bias)
    "phi": {"hidden_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 64, "max_position_embeddings": 64, "partial_rotary_factor": 0.4},
    # a LayerNorm over each query and key head, with layer_norm_eps (qk_layernorm)
    "phi-qkln": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
                 "max_position_embeddings": 64, "partial_rotary_factor": 0.5, "qk_layernorm": True,
                 "layer_norm_eps": 1e-4},
    "phi-gqa": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 64,
                "tie_word_embeddings": True, "rope_theta": 500.0},
    # GPT-J: Phi's block without attention biases, rotating interleaved pairs of a share of each head
    "gptj": {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64, "rotary_dim": 4},
    # and every feature of a head, tied
    "gptj-full": {"n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64, "rotary_dim": 16,
                  "n_inner": 48, "tie_word_embeddings": True},
    # Falcon-7B's layout: one key/value head, one norm per parallel block, tied, no biases
    "falcon": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
               "max_position_embeddings": 64},
    # Falcon-40B's: grouped keys (rows per group), a norm for each branch, untied
    "falcon-new": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
                   "new_decoder_architecture": True, "ffn_hidden_size": 48, "max_position_embeddings": 64,
                   "tie_word_embeddings": False, "rope_theta": 500.0},
    # every head its own keys ((H, 3, Dh) rows), biases, sequential blocks: GPT-NeoX's structure
    "falcon-mha": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "multi_query": False,
                   "parallel_attn": False, "bias": True, "max_position_embeddings": 64},
    # structures another family has, but not with Falcon's options, export as Falcon without
    # being told they were imported from it: one key/value head with biases (Phi's structure, but
    # Phi's head has a bias), sequential blocks without biases (GPT-NeoX's, which always has them)
    "falcon-bias": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "bias": True,
                    "max_position_embeddings": 64},
    "falcon-sequential": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "multi_query": False,
                          "parallel_attn": False, "max_position_embeddings": 64},
    # Gemma 2: a norm before and after each sublayer, soft-capped scores and logits (caps small
    # enough to act on these weights), scores scaled by query_pre_attn_scalar, a window on
    # every other layer
    "gemma2": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
               "max_position_embeddings": 64, "sliding_window": 5, "query_pre_attn_scalar": 24,
               "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0,
               "tie_word_embeddings": False},
    # StarCoder2: sequential LayerNorm blocks with grouped keys, biases, a window, tied
    "starcoder2": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64,
                   "sliding_window": 5},
    # and multi-query, no window, untied, no biases
    "starcoder2-mqa": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 1, "intermediate_size": 48, "max_position_embeddings": 64,
                       "use_bias": False, "tie_word_embeddings": False, "rope_theta": 500.0},
    # Gemma 3: Gemma 2's layer with query and key norms (gains 1 + weight), no caps, windowed
    # layers rotating with their own base, five windowed layers to one global
    "gemma3_text": {"hidden_size": 32, "num_hidden_layers": 7, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 48,
                    "max_position_embeddings": 64, "sliding_window": 4, "query_pre_attn_scalar": 16,
                    "tie_word_embeddings": False,
                    "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                        "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}},
    # BLOOM: ALiBi (slopes for 4 heads, and for 3: not a power of two), an embedding LayerNorm,
    # q/k/v rows interleaved per head as GPT-NeoX's
    "bloom": {"hidden_size": 32, "n_layer": 2, "n_head": 4},
    "bloom-untied": {"hidden_size": 48, "n_layer": 2, "n_head": 3, "tie_word_embeddings": False,
                     "layer_norm_epsilon": 1e-6},
    # OLMo: Llama with LayerNorms that have no parameters; and grouped, biased and tied
    "olmo": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
             "max_position_embeddings": 64, "rope_theta": 500.0},
    "olmo-gqa": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "intermediate_size": 48, "max_position_embeddings": 64, "attention_bias": True,
                 "tie_word_embeddings": True, "rope_theta": 500.0},
    # OLMo 2: a norm on each sublayer's output alone, query and key norms over the whole
    # projection; and grouped, biased and tied
    "olmo2": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 500.0},
    "olmo2-gqa": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "intermediate_size": 48, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
                  "attention_bias": True, "tie_word_embeddings": True, "rope_theta": 500.0},
    "gpt_neox": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "intermediate_size": 64, "max_position_embeddings": 64, "rotary_pct": 0.5},
    "gpt_neox-linear": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "intermediate_size": 64, "max_position_embeddings": 64,
                        "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.5,
                                            "partial_rotary_factor": 0.5}},
    "gpt_neox-sequential": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                            "intermediate_size": 64, "max_position_embeddings": 64,
                            "use_parallel_residual": False, "tie_word_embeddings": True},
}
DECODERS = [f for f in TINY if not f.startswith(("bert", "roberta", "xlm-roberta", "distilbert"))]


def _model_type(family: str) -> str:
    return "xlm-roberta" if family.startswith("xlm-roberta") else family.split("-")[0]


def _names(family: str) -> str | None:
    """The family whose tensor names a converted state dict takes: a Phi-3's, a Falcon's or a
    StarCoder2's own (a Phi-3 rotating every feature has a Llama's spec, a Falcon with a
    key/value head per query head GPT-NeoX's, a multi-query StarCoder2 without a window a
    Falcon's), else the spec's."""
    return _model_type(family) if _model_type(family) in ("phi3", "falcon", "starcoder2", "gpt_bigcode") else None


def _hf_model(family: str, seed: int = 0) -> Any:
    """A random transformers model of ``family`` in eval mode, with every parameter
    (norm gains and biases too) perturbed so that no mapping passes by accident."""
    model_type = _model_type(family)
    config = transformers.AutoConfig.for_model(model_type, **{**_SMALL, **TINY[family]})
    if model_type == "gemma" and config.hidden_act == "gelu":
        # released Gemma configs' legacy `gelu` means the tanh approximation, as the import and
        # later transformers read it; earlier 5.x releases (5.16) compute it exactly
        config.hidden_act = "gelu_pytorch_tanh"
    auto = {
        "t5": transformers.AutoModelForSeq2SeqLM,
        "mt5": transformers.AutoModelForSeq2SeqLM,
        "bart": transformers.AutoModelForSeq2SeqLM,
        "marian": transformers.AutoModelForSeq2SeqLM,
        "bert": transformers.AutoModelForMaskedLM,
        "roberta": transformers.AutoModelForMaskedLM,
        "xlm-roberta": transformers.AutoModelForMaskedLM,
        "distilbert": transformers.AutoModelForMaskedLM,
    }.get(model_type, transformers.AutoModelForCausalLM)
    if family.endswith("-cls"):
        auto = transformers.AutoModelForSequenceClassification
    torch.manual_seed(seed)
    # Gemma 2's soft-capped scores: transformers computes them in its eager attention alone
    # (earlier 5.x releases, 5.16 among them, default to SDPA, which leaves the cap out)
    extra = {"attn_implementation": "eager"} if model_type == "gemma2" else {}
    model = auto.from_config(config, **extra).eval()
    model.config.architectures = [type(model).__name__]  # as save_pretrained records it
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:  # not Marian's fixed sinusoids, which transformers holds as a parameter
                p.add_(torch.randn_like(p) * 0.3)
        if model_type == "marian":  # its output bias, a buffer
            model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
    if family == "mt5-untied":
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach() + torch.randn_like(model.shared.weight))
    return model


def _imported(hf: Any) -> tuple[Any, torch.nn.Module]:
    spec, state, _ = import_hf(hf.config, state_dict=hf.state_dict())
    model = build_model(spec).eval()
    model.load_state_dict(state)
    return spec, model


def _inputs(seed: int = 1, b: int = 3, t: int = 11, padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (b, t), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, 7:] = 0  # right padding: real tokens keep their positions in both libraries
        mask[2, 4:] = 0
        ids = ids.masked_fill(mask == 0, 1)  # the padding token (RoBERTa's positions depend on it)
    return ids, mask


# --------------------------------------------------------------------------- logits


@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("family", sorted(TINY))
def test_logits_match_transformers(family: str, padded: bool) -> None:
    hf = _hf_model(family)
    spec, model = _imported(hf)
    ids, mask = _inputs(padded=padded)
    real = mask.bool()
    with torch.no_grad():
        if spec.kind == "encoder-decoder":
            dec_ids, dec_mask = _inputs(seed=2, t=6, padded=padded)
            theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids,
                        decoder_attention_mask=dec_mask, output_hidden_states=True)
            ours = model(ids, attention_mask=mask, decoder_input_ids=dec_ids, decoder_attention_mask=dec_mask)
            torch.testing.assert_close(ours.encoder_hidden_states[real], theirs.encoder_last_hidden_state[real],
                                       atol=1e-4, rtol=0)
            real = dec_mask.bool()
        elif spec.kind == "encoder":
            theirs = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            ours = model(ids, attention_mask=mask)
            # the encoder's output (hidden states) and the masked-LM logits on top
            torch.testing.assert_close(ours.hidden_states[real], theirs.hidden_states[-1][real], atol=1e-4, rtol=0)
        else:
            theirs = hf(input_ids=ids, attention_mask=mask)
            ours = model(ids, attention_mask=mask)
    assert ours.logits.shape == theirs.logits.shape
    if ours.logits.dim() == 2:  # a classification head: one row of class logits per sequence
        real = slice(None)
    torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=1e-4, rtol=0)
    assert (ours.logits[real] - theirs.logits[real]).abs().max() < 1e-4
    assert theirs.logits[real].std() > 0.1  # the comparison is not between near-zero outputs


# --------------------------------------------------------------------------- training loss and gradients


def _losses(family: str) -> tuple[Any, Any, Any, torch.Tensor, torch.Tensor]:
    """(spec, our model, transformers' model, our loss, their loss) on one padded batch, each
    library given the labels its own way: transformers shifts a decoder's labels inside
    its models, specformer takes them shifted."""
    hf = _hf_model(family)
    spec, model = _imported(hf)
    ids, mask = _inputs()
    g = torch.Generator().manual_seed(4)
    if family.endswith("-cls"):
        n = spec.head.n_classes
        labels = torch.randint(0, n, (ids.shape[0],), generator=g)
        ours = model(ids, attention_mask=mask, labels=labels).loss
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    elif spec.kind == "encoder":
        labels = ids.masked_fill(torch.rand(ids.shape, generator=g) > 0.4, -100).masked_fill(mask == 0, -100)
        ours = model(ids, attention_mask=mask, labels=labels).loss
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    elif spec.kind == "encoder-decoder":
        target, target_mask = _inputs(seed=2, t=6)
        labels = target.masked_fill(target_mask == 0, -100)
        start = torch.full_like(target[:, :1], _START[spec.name])
        dec_ids = torch.cat([start, target[:, :-1]], dim=1)  # transformers' shift_tokens_right
        ours = model(ids, attention_mask=mask, decoder_input_ids=dec_ids, labels=labels).loss
        theirs = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec_ids, labels=labels).loss
    else:
        labels = ids.masked_fill(mask == 0, -100)
        shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        ours = model(ids, attention_mask=mask, labels=shifted).loss
        theirs = hf(input_ids=ids, attention_mask=mask, labels=labels).loss
    return spec, model, hf, ours, theirs


@pytest.mark.parametrize("family", sorted(TINY))
def test_training_loss_and_every_gradient_match_transformers(family: str) -> None:
    """One training step's work: the loss, and the gradient of every weight (converted to
    transformers' names as the weights are), so that a model trained here is trained as
    transformers would train it."""
    spec, model, hf, ours, theirs = _losses(family)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert theirs > 0.5  # random weights: a loss near log(V), not a degenerate zero
    ours.backward()
    theirs.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert all(g is not None and g.any() for g in grads.values())  # every weight takes part
    ours_as_hf = specformer_to_hf(grads, spec, model_type=_names(family))
    for name, p in hf.named_parameters():
        if p.grad is None:
            # a tensor transformers computes nothing with (an untied BERT's `cls.predictions.bias`,
            # an untied BART's `shared`): the export writes a copy there
            continue
        assert name in ours_as_hf, name
        # float32 sums in another order (T5 v1.1's gradients reach 20): to 1e-4 of the scale
        scale = p.grad.abs().max().item()
        torch.testing.assert_close(ours_as_hf[name], p.grad, atol=1e-4 * max(scale, 1.0), rtol=0,
                                   msg=lambda m, n=name: f"{n}: {m}")


# --------------------------------------------------------------------------- generation


def _greedy(
    model: torch.nn.Module, spec: Any, ids: torch.Tensor, mask: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding through the model's KV-cache API: one prompt pass, then one token a
    step. Returns the tokens (B, n) and each step's logits (B, n, V)."""
    tokens, logits = [], []
    with torch.no_grad():
        if spec.kind == "encoder-decoder":
            enc = model.encode(ids, mask)
            step = torch.full((ids.shape[0], 1), _START[spec.name])
            out = model(attention_mask=mask, decoder_input_ids=step, encoder_hidden_states=enc, use_cache=True)
            for _ in range(n):
                logits.append(out.logits[:, -1])
                step = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(step)
                out = model(attention_mask=mask, decoder_input_ids=step, encoder_hidden_states=enc, cache=out.cache)
        else:
            out = model(ids, attention_mask=mask, use_cache=True)
            for _ in range(n):
                logits.append(out.logits[:, -1])
                step = out.logits[:, -1].argmax(-1, keepdim=True)
                tokens.append(step)
                mask = torch.cat([mask, torch.ones_like(step)], dim=1)
                out = model(step, attention_mask=mask, cache=out.cache)
    return torch.cat(tokens, dim=1), torch.stack(logits, dim=1)


_START = {"t5": 0, "mt5": 0, "bart": 2, "marian": 0}  # decoder start tokens: T5, Marian from pad, BART eos


# Phi-3's own generate drops its cache at the step that passes LongRoPE's original context and
# reads the whole sequence again with the long factors; specformer keeps the cache there, as
# Llama's generate does (docs/interop.md), so the tokens after that step differ
_GENERATES_OTHERWISE = {"phi3-longrope"}


@pytest.mark.parametrize("family", sorted(f for f in DECODERS if f not in _GENERATES_OTHERWISE))
def test_greedy_generation_matches_transformers_generate(family: str) -> None:
    hf = _hf_model(family)
    spec, model = _imported(hf)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, V, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    if spec.kind == "decoder":
        mask[1, :3] = 0  # left padding, as batched generation uses
    hf.generation_config.eos_token_id = None  # always 20 tokens
    hf.generation_config.forced_eos_token_id = None
    extra = {"decoder_start_token_id": _START[spec.name]} if spec.kind == "encoder-decoder" else {}
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False,
                             num_beams=1, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                             **extra)
    tokens = theirs.sequences[:, 1:] if spec.kind == "encoder-decoder" else theirs.sequences[:, ids.shape[1]:]
    ours, our_logits = _greedy(model, spec, ids, mask, 20)
    assert ours.shape == (2, 20)
    assert torch.equal(ours, tokens)
    # every step's logits agree too, so the cache is checked even where greedy output repeats
    torch.testing.assert_close(our_logits, torch.stack(theirs.logits, dim=1), atol=1e-4, rtol=1e-4)
    if spec.kind == "decoder":
        assert len(set(ours[0].tolist())) > 1  # not a degenerate repeat of one token


def _generative(family: str) -> tuple[Any, Any, torch.nn.Module, int | None, dict[str, int]]:
    """transformers' model of ``family`` and ours, with the decoder's start token (None for a
    decoder-only model) and the generate() argument that names it; no forced end token."""
    hf = _hf_model(family)
    spec, model = _imported(hf)
    hf.generation_config.forced_eos_token_id = None
    start = _START[spec.name] if spec.kind == "encoder-decoder" else None
    return hf, spec, model, start, ({"decoder_start_token_id": start} if start is not None else {})


@pytest.mark.parametrize("family", sorted(DECODERS))
def test_beam_search_matches_transformers_beam_search(family: str) -> None:
    from specformer.training.generate import beam_search

    hf, spec, model, start, extra = _generative(family)
    ended = 0
    for seed in range(2):
        ids = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(seed))
        mask = torch.ones_like(ids)
        if spec.kind == "decoder":
            mask[1, :3] = 0  # left padding
        else:
            mask[1, 5:] = 0
        with torch.no_grad():
            greedy = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                                 num_beams=1, eos_token_id=None, pad_token_id=1, **extra)
        eos = int(greedy[seed, -3 + seed])  # a token likely early: beams end at it, at different steps
        for k, early_stopping, length_penalty in [(3, False, 1.0), (4, True, 1.0), (2, False, 0.7)]:
            with torch.no_grad():
                # pad_token_id=1, not 0: transformers fills with `pad_token_id or eos`, so 0 fills with eos
                theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                     num_beams=k, eos_token_id=eos, pad_token_id=1, early_stopping=early_stopping,
                                     length_penalty=length_penalty, **extra)
            ours = beam_search(model, ids, attention_mask=mask, num_beams=k, max_new_tokens=10, eos_id=eos,
                               pad_id=1, early_stopping=early_stopping, length_penalty=length_penalty,
                               start_id=start)
            theirs = theirs[:, 1:] if start is not None else theirs
            assert torch.equal(ours, theirs), (k, early_stopping, length_penalty, ours, theirs)
            ended += int((ours == eos).any(-1).sum())
    assert ended  # the end token was met, and what follows it compared


@pytest.mark.parametrize("family", ["gpt2", "llama", "t5", "bart"])
def test_repetition_penalties_match_transformers(family: str) -> None:
    from specformer.training.generate import beam_search, generate, generate_seq2seq

    hf, spec, model, start, extra = _generative(family)
    ids = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(0))
    for penalty, ngram in [(1.3, 0), (1.0, 2), (0.8, 3)]:
        settings = {"repetition_penalty": penalty, "no_repeat_ngram_size": ngram}
        for beams in (1, 3):
            with torch.no_grad():
                theirs = hf.generate(input_ids=ids, max_new_tokens=12, do_sample=False, num_beams=beams,
                                     eos_token_id=None, pad_token_id=1, **settings, **extra)
            if beams > 1:
                ours = beam_search(model, ids, num_beams=beams, max_new_tokens=12, eos_id=None, start_id=start,
                                   **settings)
            elif start is None:
                ours = generate(model, ids, max_new_tokens=12, temperature=0.0, **settings)
            else:
                ours = generate_seq2seq(model, ids, start_id=start, eos_id=None, max_new_tokens=12, **settings)
            theirs = theirs[:, 1:] if start is not None else theirs
            assert torch.equal(ours, theirs), (penalty, ngram, beams)
            if ngram:  # and no n-gram of the output repeats
                for row in ours.tolist():
                    grams = [tuple(row[i:i + ngram]) for i in range(len(row) - ngram + 1)]
                    assert len(grams) == len(set(grams))


@pytest.mark.parametrize("family", ["gpt2", "llama", "t5", "bart"])
def test_sampling_matches_transformers_sampling_from_the_same_seed(family: str) -> None:
    # temperature, top-k and top-p filter the same tokens, and the draw takes the same
    # random numbers: with torch's global seed set alike, the sampled tokens are the same
    from specformer.training.generate import generate, generate_seq2seq

    hf, spec, model, start, extra = _generative(family)
    ids = torch.randint(3, V, (3, 7), generator=torch.Generator().manual_seed(0))
    for temperature, top_k, top_p in [(1.0, None, None), (0.7, 20, None), (1.3, None, 0.9), (0.9, 10, 0.8)]:
        torch.manual_seed(123)
        with torch.no_grad():
            theirs = hf.generate(input_ids=ids, max_new_tokens=15, do_sample=True, temperature=temperature,
                                 top_k=top_k or 0, top_p=top_p or 1.0, eos_token_id=None, pad_token_id=1, **extra)
        torch.manual_seed(123)
        settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
        if start is None:
            ours = generate(model, ids, max_new_tokens=15, **settings)
        else:
            ours = generate_seq2seq(model, ids, start_id=start, eos_id=None, max_new_tokens=15, **settings)
            theirs = theirs[:, 1:]
        assert torch.equal(ours, theirs), settings
        assert len(set(ours[0].tolist())) > 3  # sampled, not a greedy repeat


def test_training_generate_matches_transformers_generate() -> None:
    generation = pytest.importorskip("specformer.training.generate", reason="specformer.training is not available")
    hf = _hf_model("llama")
    _, model = _imported(hf)
    ids = torch.randint(3, V, (2, 6), generator=torch.Generator().manual_seed(5))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, max_new_tokens=20, do_sample=False, num_beams=1, pad_token_id=0)
    ours = generation.generate(model, ids, max_new_tokens=20, temperature=0.0)
    assert torch.equal(ours, theirs)


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize("family", sorted(TINY))
def test_export_loads_back_into_transformers(family: str, tmp_path) -> None:
    hf = _hf_model(family)
    spec, model = _imported(hf)
    save_hf(model, spec, tmp_path, imported_as=_model_type(family))  # as export-hf of imported weights
    extra = {"attn_implementation": "eager"} if _model_type(family) == "gemma2" else {}  # see _hf_model
    loaded = type(hf).from_pretrained(tmp_path, **extra).eval()
    live = to_hf(model, spec)
    ids, mask = _inputs(seed=4)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if spec.kind == "encoder-decoder":
        kwargs["decoder_input_ids"] = ids[:, :5]
    with torch.no_grad():
        expected = hf(**kwargs).logits
        torch.testing.assert_close(loaded(**kwargs).logits, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(live(**kwargs).logits, expected, atol=1e-5, rtol=0)
    # the re-imported export is the same specformer model
    spec2, state2, _ = import_hf(tmp_path)
    assert spec2.model_copy(update={"name": spec.name}) == spec
    for name, tensor in model.state_dict().items():
        assert torch.equal(state2[name], tensor), name


@pytest.mark.parametrize("family", sorted(TINY))
def test_state_dict_conversion_round_trips_exactly(family: str) -> None:
    hf = _hf_model(family)
    spec, _ = _imported(hf)
    theirs = hf.state_dict()
    ours, report = hf_to_specformer(theirs, spec)
    back = specformer_to_hf(ours, spec, model_type=_names(family))
    for name, tensor in back.items():
        if name in report.ignored:  # a tensor transformers does not compute with (untied BERT, BART)
            continue
        assert torch.equal(tensor, theirs[name]), name
    persistent = {n for n in theirs if n in dict(hf.named_parameters(remove_duplicate=False))}
    assert persistent <= set(back)


def test_weights_of_other_shapes_than_the_spec_says_are_refused_both_ways() -> None:
    # a config that does not describe its weights (a wrong num_key_value_heads, an edited
    # tensor): refused with the tensors' shapes, not a reshape's traceback or a wrong file
    for family, name, rows in (("llama", "model.layers.0.self_attn.k_proj.weight", 12),
                               ("gpt_neox", "gpt_neox.layers.0.attention.query_key_value.weight", 95),
                               ("llama", "model.layers.1.mlp.up_proj.weight", 80)):
        hf = _hf_model(family)
        spec, _ = _imported(hf)
        theirs = dict(hf.state_dict())
        theirs[name] = theirs[name][:rows] if rows < theirs[name].shape[0] else torch.cat(
            [theirs[name], theirs[name][: rows - theirs[name].shape[0]]])
        with pytest.raises(HFConversionError, match=rf"the {family} checkpoint's .*{name} \({rows}, ") as info:
            hf_to_specformer(theirs, spec)
        assert "not fit the spec's decoder.layers." in str(info.value), info.value
    # and a specformer state dict of another model than the spec exports: named before anything is written
    hf = _hf_model("llama")
    spec, model = _imported(hf)
    ours = dict(model.state_dict())
    ours["decoder.layers.0.ffn.up_proj.weight"] = torch.zeros(80, spec.d_model)
    with pytest.raises(HFConversionError, match=r"the weights do not fit the spec: 1 tensor\(s\) of other shapes, "
                                               r"decoder.layers.0.ffn.up_proj.weight \(80, 32\) \(the spec's \(64, 32\)\)"):
        specformer_to_hf(ours, spec)


def test_neox_query_key_value_is_regrouped_per_head() -> None:
    hf = _hf_model("gpt_neox")
    spec, model = _imported(hf)
    fused = hf.state_dict()["gpt_neox.layers.0.attention.query_key_value.weight"]  # rows (H, 3, Dh)
    ours = model.state_dict()["decoder.layers.0.self_attn.qkv_proj.weight"]  # rows (3, H, Dh)
    h, dh = 4, 8
    assert torch.equal(ours[:dh], fused[:dh])  # q of head 0
    assert torch.equal(ours[dh: 2 * dh], fused[3 * dh: 4 * dh])  # q of head 1
    assert torch.equal(ours[h * dh: h * dh + dh], fused[dh: 2 * dh])  # k of head 0


@pytest.mark.parametrize("n_heads", [1, 3, 5, 6, 12, 16, 20, 40, 71])
def test_alibi_bias_is_blooms(n_heads: int) -> None:
    # BLOOM's build_alibi_tensor is transformers' ALiBi (slopes for any head count, the paper's
    # rule for a count that is not a power of two). It biases key j by slope * j, specformer by
    # -slope * (i - j): for a causal query i the two differ by slope * i over all its keys,
    # which the softmax cannot tell apart
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    from specformer.components.positional import ALiBi, alibi_slopes
    from specformer.specs.schema import AlibiSpec

    t = 9
    ours = ALiBi(AlibiSpec(), n_heads=n_heads).bias(torch.arange(t), torch.arange(t), dtype=torch.float64)[0]
    theirs = build_alibi_tensor(torch.ones(1, t), n_heads, torch.float64).view(n_heads, 1, t)  # (H, 1, Tk)
    slopes = theirs[:, 0, 1]  # key 1's bias
    torch.testing.assert_close(slopes, torch.tensor(alibi_slopes(n_heads), dtype=torch.float64), atol=1e-7, rtol=1e-6)
    seen = torch.ones(t, t, dtype=torch.bool).tril()  # (query, key)
    query = torch.arange(t, dtype=torch.float64)[:, None]
    torch.testing.assert_close((theirs - ours).masked_fill(~seen, 0), (slopes[:, None, None] * query).masked_fill(~seen, 0),
                               atol=1e-6, rtol=1e-6)


def test_t5_relative_bias_moves_from_the_first_layer_to_the_stack() -> None:
    hf = _hf_model("t5")
    _, model = _imported(hf)
    sd = hf.state_dict()
    for role in ("encoder", "decoder"):
        assert torch.equal(
            model.state_dict()[f"{role}.rel_bias.weight"],
            sd[f"{role}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"],
        )


# --------------------------------------------------------------------------- files and failures


def test_import_from_a_directory_with_safetensors_or_pytorch_bin(tmp_path) -> None:
    hf = _hf_model("gpt2")
    hf.save_pretrained(tmp_path / "st")
    spec, state, report = import_hf(tmp_path / "st")
    assert report.tied == ["lm_head.weight"] or report.tied == []
    # pytorch_model.bin, and a bare GPT2Model checkpoint without the "transformer." prefix
    (tmp_path / "bin").mkdir()
    (tmp_path / "st" / "config.json").rename(tmp_path / "bin" / "config.json")
    torch.save(hf.transformer.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    spec2, state2, _ = import_hf(tmp_path / "bin")
    assert (spec.name, spec2.name) == ("st", "bin")  # named after the folder
    assert spec2.model_copy(update={"name": "st"}) == spec
    assert state2.keys() == state.keys()
    for name in state:
        assert torch.equal(state2[name], state[name])


def test_sharded_checkpoint_is_read_whole(tmp_path) -> None:
    hf = _hf_model("llama")
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    spec, state, _ = import_hf(tmp_path)
    assert len(read_hf_state_dict(tmp_path)) == len(hf.state_dict())
    model = build_model(spec)
    model.load_state_dict(state)


def test_old_checkpoint_names_are_understood() -> None:
    hf = _hf_model("bert")
    sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in hf.state_dict().items()}
    spec, state, _ = import_hf(hf.config, state_dict=sd)
    assert torch.equal(state["embed.norm.weight"], hf.state_dict()["bert.embeddings.LayerNorm.weight"])
    neox = _hf_model("gpt_neox")
    sd = {("embed_out.weight" if k == "lm_head.weight" else k): v for k, v in neox.state_dict().items()}
    spec, state, _ = import_hf(neox.config, state_dict=sd)
    assert torch.equal(state["head.proj.weight"], neox.state_dict()["lm_head.weight"])


def test_untied_checkpoint_gets_an_untied_spec() -> None:
    hf = _hf_model("llama")
    config = hf.config.to_dict() | {"tie_word_embeddings": True}
    sd = hf.state_dict()  # its lm_head differs from the embeddings
    spec, state, _ = import_hf(config, state_dict=sd)
    assert not spec.embedding.tie_output
    assert torch.equal(state["head.proj.weight"], sd["lm_head.weight"])
    tied_spec, _, _ = import_hf(config, weights=False)
    with pytest.raises(HFConversionError, match="lm_head.weight differs from the token embeddings"):
        load_hf_weights(build_model(tied_spec), sd)


def test_untied_bart_keeps_a_token_table_per_stack() -> None:
    hf = _hf_model("bart-untied")
    sd = dict(hf.state_dict())
    enc, dec = sd["model.encoder.embed_tokens.weight"], sd["model.decoder.embed_tokens.weight"]
    assert not torch.equal(enc, dec)
    spec, state, report = import_hf(hf.config, state_dict=sd)
    assert (spec.embedding.share_encoder_decoder, spec.embedding.tie_output) == (False, False)
    assert torch.equal(state["embed.tokens.weight"], enc) and torch.equal(state["decoder_embed.tokens.weight"], dec)
    assert "model.shared.weight" in report.ignored
    # a checkpoint saved by transformers 4 holds the one table both stacks read, as `shared`
    old = {k: v for k, v in sd.items() if ".embed_tokens." not in k}
    _, state4, _ = import_hf(hf.config, state_dict=old)
    for name in ("embed.tokens.weight", "decoder_embed.tokens.weight"):
        assert torch.equal(state4[name], sd["model.shared.weight"])
    # a spec whose stacks share one table cannot take two different ones
    shared = spec.model_copy(update={"embedding": {"share_encoder_decoder": True, "tie_output": False,
                                                   "share_positions": False}})
    assert shared.embedding.share_encoder_decoder
    with pytest.raises(HFConversionError, match="import it with embedding.share_encoder_decoder: false"):
        load_hf_weights(build_model(shared), sd)


def test_bart_spec_with_one_table_and_an_untied_head_exports_a_table_per_stack(tmp_path) -> None:
    hf = _hf_model("bart")
    spec, model = _imported(hf)
    untied = spec.model_copy(update={"embedding": {**spec.embedding.model_dump(), "tie_output": False}})
    ours = build_model(untied).eval()
    ours.load_state_dict({**model.state_dict(), "head.proj.weight": torch.randn(V, 32)}, strict=True)
    save_hf(ours, untied, tmp_path)
    loaded = type(hf).from_pretrained(tmp_path).eval()
    assert loaded.config.tie_word_embeddings is False
    ids, mask = _inputs(seed=4)
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits
        got = loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["bert-untied", "roberta-untied", "bart-untied"])
def test_untied_imports_read_the_tensors_transformers_computes_with(family: str) -> None:
    hf = _hf_model(family)
    _, state, report = import_hf(hf.config, state_dict=hf.state_dict())
    sd = hf.state_dict()
    if family == "bart-untied":
        assert torch.equal(state["embed.tokens.weight"], sd["model.encoder.embed_tokens.weight"])
        assert "model.shared.weight" in report.ignored
    else:
        h = "cls.predictions" if family.startswith("bert") else "lm_head"
        assert torch.equal(state["head.bias"], sd[f"{h}.decoder.bias"])
        assert report.ignored == [f"{h}.bias"]


def test_missing_and_unexpected_tensors_are_named() -> None:
    hf = _hf_model("gpt2")
    spec, model = _imported(hf)
    sd = dict(hf.state_dict())
    del sd["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(HFConversionError, match=r"lacks 1 tensor\(s\).*transformer\.h\.1\.mlp\.c_fc\.bias"):
        load_hf_weights(model, sd)
    sd = dict(hf.state_dict()) | {"transformer.h.0.attn.extra.weight": torch.zeros(2)}
    with pytest.raises(HFConversionError, match=r"no place for: transformer\.h\.0\.attn\.extra\.weight"):
        load_hf_weights(model, sd)
    sd = dict(hf.state_dict())
    sd["transformer.h.0.ln_1.weight"] = torch.ones(7)
    with pytest.raises(HFConversionError, match=r"checkpoint's transformer\.h\.0\.ln_1\.weight \(7,\) does not fit the "
                                               r"spec's decoder\.layers\.0\.attn_norm\.weight \(32,\)"):
        load_hf_weights(model, sd)


def test_bare_model_with_a_tied_lm_head_imports_from_its_own_folder(tmp_path) -> None:
    hf = _hf_model("gpt2")
    hf.transformer.save_pretrained(tmp_path)  # a GPT2Model: config.json says architectures ["GPT2Model"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["GPT2Model"]
    spec, state, _ = import_hf(tmp_path)
    model = build_model(spec).eval()
    model.load_state_dict(state)
    ids, mask = _inputs()
    with torch.no_grad():  # the LM head is the token embeddings, which the bare model has
        torch.testing.assert_close(model(ids, attention_mask=mask).logits[mask.bool()],
                                   hf(input_ids=ids, attention_mask=mask).logits[mask.bool()], atol=1e-4, rtol=0)


def test_bare_bert_folder_is_refused_naming_the_missing_head(tmp_path) -> None:
    hf = _hf_model("bert")
    hf.bert.save_pretrained(tmp_path)  # a BertModel: no masked-LM head
    with pytest.raises(HFConversionError, match=r"BertModel is the bare bert encoder.*cls\.predictions"):
        import_hf(tmp_path)
    with pytest.raises(HFConversionError, match=r"BertModel is the bare bert encoder"):
        import_hf(tmp_path, weights=False)


def test_checkpoint_without_the_spec_head_says_so() -> None:
    # a config that names no class: the family's own head, which these checkpoints lack
    hf = _hf_model("bert")
    config = hf.config.to_dict() | {"architectures": None}
    with pytest.raises(HFConversionError, match=r"lacks 5 tensor\(s\).*no weights for the spec's mlm head"):
        import_hf(config, state_dict=hf.bert.state_dict())
    cls = _hf_model("bert-cls")
    with pytest.raises(HFConversionError, match=r"no weights for the spec's mlm head"):
        import_hf(config, state_dict=cls.state_dict())
    gpt2 = transformers.GPT2ForSequenceClassification(_hf_model("gpt2").config)
    with pytest.raises(HFConversionError, match=r"no place for: score\.weight; they are a task head's"):
        import_hf(gpt2.config.to_dict() | {"architectures": None}, state_dict=gpt2.state_dict())


def test_classification_weights_need_the_familys_pooling() -> None:
    hf = _hf_model("bert-cls")
    spec, _, _ = import_hf(hf.config, weights=False)
    mean = spec.model_copy(update={"head": spec.head.model_copy(update={"pooling": "mean"})})
    with pytest.raises(HFConversionError, match="pooling 'mean', pooler True, pooler_activation 'tanh' has no bert "):
        hf_to_specformer(hf.state_dict(), mean)
    relu = spec.model_copy(update={"head": spec.head.model_copy(update={"pooler_activation": "relu"})})
    with pytest.raises(HFConversionError, match="pooler_activation 'relu' has no bert counterpart.*dense \\+ tanh"):
        hf_to_specformer(hf.state_dict(), relu)
    distil = _hf_model("distilbert-cls")
    spec, _, _ = import_hf(distil.config, weights=False)
    assert spec.head.pooler_activation == "relu" and spec.head.dropout == 0.1
    tanh = spec.model_copy(update={"head": spec.head.model_copy(update={"pooler_activation": "tanh"})})
    with pytest.raises(HFConversionError, match="'tanh' has no distilbert counterpart.*dense \\+ relu pooler"):
        hf_to_specformer(distil.state_dict(), tanh)


def test_load_hf_weights_reproduces_the_reference() -> None:
    hf = _hf_model("t5-v1_1")
    spec, _, _ = import_hf(hf.config, weights=False)
    model = build_model(spec).eval()
    report = load_hf_weights(model, hf.state_dict())
    assert "encoder.embed_tokens.weight" in report.tied
    ids, mask = _inputs()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :4]).logits
        got = model(ids, attention_mask=mask, decoder_input_ids=ids[:, :4]).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


_DOC_SECTIONS = {"gpt2": "### GPT-2", "gpt_bigcode": "### GPT-BigCode", "gpt_bigcode-mha": "### GPT-BigCode", "olmo": "### OLMo (", "olmo-gqa": "### OLMo (", "olmo2": "### OLMo 2", "olmo2-gqa": "### OLMo 2", "bloom": "### BLOOM", "bloom-untied": "### BLOOM", "opt": "### OPT", "opt-post": "### OPT", "bert": "### BERT", "roberta": "### RoBERTa", "t5-v1_1": "### T5",
                 "bart": "### BART", "marian": "### Marian", "marian-untied": "### Marian", "llama": "### Llama", "qwen2": "### Llama", "qwen3": "### Llama", "gemma": "### Llama", "phi3": "### Phi-3",
                 "gpt_neox": "### GPT-NeoX", "phi": "### Phi-1", "phi-gqa": "### Phi-1", "phi-qkln": "### Phi-1", "gptj": "### GPT-J",
                 "gptj-full": "### GPT-J", "falcon-new": "### Falcon",
                 "gemma2": "### Gemma 2", "gemma3_text": "### Gemma 2", "starcoder2": "### StarCoder2",
                 "bert-cls": "### BERT sequence classification",
                 "roberta-cls": "### RoBERTa sequence classification",
                 "distilbert": "### DistilBERT", "distilbert-cls": "### DistilBERT sequence classification"}


@pytest.mark.parametrize("family", sorted(_DOC_SECTIONS))
def test_documented_weight_names_exist_on_both_sides(family: str) -> None:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "interop.md").read_text()
    section = text.split(_DOC_SECTIONS[family], 1)[1].split("\n### ", 1)[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| `")]
    assert rows
    hf = _hf_model(family)
    spec, model = _imported(hf)
    theirs = set(hf.state_dict())
    ours = set(model.state_dict())
    for ours_cell, theirs_cell, conversion in rows:
        if "Qwen3 only" in conversion and family != "qwen3":
            continue
        if "Gemma 3 only" in conversion and family != "gemma3_text":
            continue
        if "only when tied" in conversion and not spec.embedding.tie_output:
            continue
        if "only when untied" in conversion and spec.embedding.tie_output and not ours_cell.strip().startswith(
                "`head.proj"):
            continue
        if "with qk_layernorm only" in conversion and spec.decoder.attention.qk_norm == "none":
            continue
        if "pre-norm only" in conversion and not spec.decoder.final_norm:
            continue
        ours_name = ours_cell.strip().strip("`").replace("{i}", "0")
        if not (ours_name == "head.proj" and spec.embedding.tie_output):
            assert any(n.startswith(ours_name + ".") or n == ours_name for n in ours), ours_name
        for name in theirs_cell.split("(")[0].split(","):
            name = name.strip().strip("`").replace("{i}", "0")
            assert any(n.startswith(name + ".") or n == name for n in theirs), name


_SMALL_DECODER = dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, initializer_range=0.5)


@pytest.mark.parametrize(
    ("model_type", "extra", "windows"),
    [
        ("mistral", {"sliding_window": 3}, [3, 3]),
        ("mistral", {"sliding_window": None}, [None, None]),
        ("llama", {"sliding_window": 3}, [None, None]),  # Llama has no window in transformers
        ("mistral", {"sliding_window": 3, "use_sliding_window": False}, [3, 3]),  # a Qwen2 key Mistral ignores
        ("mistral", {"sliding_window": 3, "layer_types": ["full_attention", "sliding_attention"]}, [3, 3]),
    ],
    ids=["mistral", "mistral-no-window", "llama-window-key", "use-sliding-window", "layer-types"],
)
def test_llama_and_mistral_windows_are_what_transformers_computes(model_type: str, extra: dict, windows: list) -> None:
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **_SMALL_DECODER, **extra)
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    spec, state, _ = import_hf(hf.config, state_dict=hf.state_dict())
    assert [layer.attention.sliding_window for layer in spec.decoder.layers()] == windows
    model = build_model(spec).eval()
    model.load_state_dict(state)
    ids = torch.randint(0, 101, (1, 12))  # longer than the window
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_keys_a_mistral_config_omits_take_mistral_defaults() -> None:
    # save_pretrained writes only what differs from the config class's defaults
    minimal = {"model_type": "mistral", "vocab_size": 100, "hidden_size": 64, "num_attention_heads": 8,
               "num_hidden_layers": 2}
    hf = transformers.AutoConfig.for_model(**minimal)
    spec = spec_from_hf_config(minimal)
    att = spec.decoder.attention
    assert (att.sliding_window, att.n_kv_heads, spec.decoder.ffn.d_ff, spec.max_seq_len) == (
        hf.sliding_window, hf.num_key_value_heads, hf.intermediate_size, hf.max_position_embeddings)
    llama = {**minimal, "model_type": "llama"}
    hf = transformers.AutoConfig.for_model(**llama)
    spec = spec_from_hf_config(llama)
    assert (spec.decoder.attention.n_kv_heads, spec.decoder.ffn.d_ff, spec.max_seq_len) == (
        hf.num_key_value_heads, hf.intermediate_size, hf.max_position_embeddings)


# --------------------------------------------------------------------------- families under other names


@pytest.mark.parametrize(
    ("family", "auto", "written_as"),
    [
        ("mt5", "AutoModelForSeq2SeqLM", ("mt5", "MT5ForConditionalGeneration")),
        ("mt5-untied", "AutoModelForSeq2SeqLM", ("mt5", "MT5ForConditionalGeneration")),
        ("xlm-roberta", "AutoModelForMaskedLM", ("xlm-roberta", "XLMRobertaForMaskedLM")),
        ("xlm-roberta-cls", "AutoModelForSequenceClassification",
         ("xlm-roberta", "XLMRobertaForSequenceClassification")),
        ("t5", "AutoModelForSeq2SeqLM", ("t5", "T5ForConditionalGeneration")),
        ("roberta", "AutoModelForMaskedLM", ("roberta", "RobertaForMaskedLM")),
    ],
)
def test_mt5_and_xlm_roberta_weights_export_under_their_own_name(
    family: str, auto: str, written_as: tuple[str, str], tmp_path
) -> None:
    """The spec of an mT5 or XLM-R is T5's or RoBERTa's; the weights import-hf writes record
    the model_type, so export-hf writes them back under it, and AutoModel loads MT5 / XLM-R
    classes; a plain T5 or RoBERTa stays itself, with no word of the other names."""
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from specformer.analysis import count_parameters
    from specformer.cli import app
    from specformer.specs.loader import load_spec

    hf = _hf_model(family)
    hf.save_pretrained(tmp_path / "hf")
    model_type = _model_type(family)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == model_type
    spec_path, weights = tmp_path / "m.yaml", tmp_path / "m.safetensors"
    runner = CliRunner()
    result = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    renamed = model_type in ("mt5", "xlm-roberta")
    assert ("export-hf writes them (and a run started from them) back as Hugging Face "
            f"{written_as[0]}" in " ".join(result.output.split())) == renamed, result.output
    spec = load_spec(spec_path)
    assert spec.embedding.tie_output == (family != "mt5-untied")
    # the parameters transformers holds, a tied tensor once
    assert count_parameters(spec).total == sum(p.numel() for p in hf.parameters())
    model = build_model(spec).eval()
    model.load_state_dict(load_file(str(weights)))
    ids, mask = _inputs()
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if spec.kind == "encoder-decoder":
        kwargs["decoder_input_ids"] = ids[:, :5]
    with torch.no_grad():
        expected = hf(**kwargs).logits
        ours = model(ids, **{k: v for k, v in kwargs.items() if k != "input_ids"}).logits
    real = mask.bool() if spec.kind == "encoder" and expected.dim() == 3 else slice(None)
    torch.testing.assert_close(ours[real], expected[real], atol=1e-4, rtol=0)
    assert expected[real].std() > 0.1
    result = runner.invoke(app, ["export-hf", str(weights), "--spec", str(spec_path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split()).replace(str(tmp_path), "TMP")  # the test's name has mt5 in it
    assert f"Hugging Face {written_as[0]} config.json" in said
    assert ("the name the weights were imported under" in said) == renamed
    assert not any(name in said for name in ("mt5", "xlm-roberta") if name != model_type), said
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == (written_as[0], [written_as[1]])
    back = getattr(transformers, auto).from_pretrained(tmp_path / "out").eval()
    assert type(back).__name__ == written_as[1]
    with torch.no_grad():
        torch.testing.assert_close(back(**kwargs).logits, expected, atol=1e-5, rtol=0)
    # weights with no record of an import (saved by another tool) are written as the family the spec is
    from safetensors.torch import save_file

    save_file(load_file(str(weights)), str(tmp_path / "plain.safetensors"))
    result = runner.invoke(app, ["export-hf", str(tmp_path / "plain.safetensors"), "--spec", str(spec_path),
                                 "-o", str(tmp_path / "plain")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "plain" / "config.json").read_text())["model_type"] == {
        "mt5": "t5", "xlm-roberta": "roberta"}.get(model_type, model_type)
    assert "imported under" not in result.output


def test_an_mt5_config_never_scales_the_decoder_output() -> None:
    # MT5ForConditionalGeneration has no output scaling; T5 scales when tie_word_embeddings is true
    config = {"model_type": "mt5", "vocab_size": V, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 1,
              "num_heads": 4}
    for tied in (True, False, None):
        spec = spec_from_hf_config({**config, "tie_word_embeddings": tied})
        assert spec.head.scale_input is False
        assert spec.embedding.tie_output is (tied is not False)
        assert (spec.encoder.ffn.type, spec.encoder.ffn.activation) == ("glu", "gelu_tanh")
    assert spec_from_hf_config({**config, "model_type": "t5", "tie_word_embeddings": True}).head.scale_input
    # keys a config leaves out take MT5Config's defaults, not T5Config's
    minimal = spec_from_hf_config({"model_type": "mt5"})
    hf = transformers.AutoConfig.for_model("mt5")
    assert (minimal.vocab_size, minimal.encoder.n_layers, minimal.encoder.attention.n_heads, minimal.encoder.ffn.d_ff) == (
        hf.vocab_size, hf.num_layers, hf.num_heads, hf.d_ff)
    assert spec_from_hf_config({"model_type": "xlm-roberta"}).vocab_size == transformers.AutoConfig.for_model(
        "xlm-roberta").vocab_size


@pytest.mark.parametrize(
    ("model_type", "name", "words"),
    [
        ("mt5", "MT5EncoderModel", ["it is the encoder alone", "supported mt5 architectures: MT5ForConditionalGeneration"]),
        ("xlm-roberta", "XLMRobertaModel", ["XLMRobertaModel is the bare xlm-roberta encoder", "lm_head.*"]),
        ("xlm-roberta", "XLMRobertaForTokenClassification", ["no token-classification head",
                                                             "XLMRobertaForSequenceClassification"]),
    ],
)
def test_mt5_and_xlm_roberta_classes_without_a_spec_head_are_refused_by_name(
    model_type: str, name: str, words: list[str]
) -> None:
    kwargs = TINY[model_type]
    with pytest.raises(HFConversionError) as info:
        spec_from_hf_config({"model_type": model_type, **_SMALL, **kwargs, "architectures": [name]})
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize("family", ["llama-llama3", "llama-yarn", "gpt_neox-linear"])
def test_scaled_rope_matches_transformers_past_the_original_context(family: str) -> None:
    # 60 positions, past the original context (16 for the Llama ones) and its longest blended
    # wavelength: in one forward, and decoded one token at a time with the cache after a prompt of 20
    hf = _hf_model(family)
    spec, model = _imported(hf)
    assert spec.positional.scaling is not None and spec.positional.scaling.type == family.split("-")[1]
    ids = torch.randint(3, V, (2, 60), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
        ours = model(ids).logits
        out = model(ids[:, :20], use_cache=True)
        steps = [out.logits]
        for t in range(20, 60):
            out = model(ids[:, t : t + 1], cache=out.cache)
            steps.append(out.logits)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), theirs, atol=1e-4, rtol=0)
    # the scaling is what makes them agree: the same weights unscaled are another model
    plain = build_model(spec.model_copy(update={"positional": {**spec.positional.model_dump(), "scaling": None}}))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain.eval()(ids).logits - theirs).abs().max() > 0.1


@pytest.mark.parametrize("padded", [False, True])
def test_mistral_generates_past_max_position_embeddings_as_transformers_does(padded: bool) -> None:
    # window 6 and 8 positions: transformers' Mistral decodes on past them with its sliding-window
    # cache at the tokens' own positions, and so does specformer's generate. Re-reading the last 8
    # tokens at 8 would lose some of the 2 × (6 - 1) + 1 = 11 that decide the next one
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "mistral", **{**_SMALL, **TINY["mistral"], "max_position_embeddings": 8, "sliding_window": 6})
    hf = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    spec, model = _imported(hf)
    assert spec.max_seq_len == 8 and [a.attention.sliding_window for a in spec.decoder.layers()] == [6, 6]
    ids = torch.randint(3, V, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :3] = 0
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=40, do_sample=False, num_beams=1,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    from specformer.training.generate import generate

    steps: list[torch.Tensor] = []
    model.register_forward_hook(lambda m, args, out: steps.append(out.logits[:, -1]))
    ours = generate(model, ids, attention_mask=mask, max_new_tokens=40, temperature=0.0)
    assert ours.shape == (2, 47) and torch.equal(ours, theirs.sequences)
    torch.testing.assert_close(torch.stack(steps, dim=1), torch.stack(theirs.logits, dim=1), atol=1e-4, rtol=1e-4)
    assert len(set(ours[0, 7:].tolist())) > 1


def test_gemma3_computes_without_the_score_cap_its_config_may_name() -> None:
    # transformers' Gemma 3 attention never reads attn_logit_softcapping (Gemma 2's does): the
    # import leaves it out, and a capped spec has no gemma3_text export
    hf = _hf_model("gemma3_text")
    capped = type(hf)(type(hf.config).from_dict({**hf.config.to_dict(), "attn_logit_softcapping": 1.0})).eval()
    capped.load_state_dict(hf.state_dict())
    spec, model = _imported(capped)
    assert spec.decoder.attention.softcap is None
    ids, mask = _inputs(padded=False)
    with torch.no_grad():
        ours, theirs = model(ids).logits, capped(input_ids=ids).logits
    assert (ours - theirs).abs().max() < 1e-4
    with pytest.raises(HFConversionError, match=r"decoder\.attention\.softcap = 1\.0 \(Hugging Face gemma3_text has None\)"):
        hf_config_from_spec(load_spec(spec, ["decoder.attention.softcap=1.0"]))


def test_the_multimodal_gemma3_imports_its_language_model_alone(tmp_path) -> None:
    """Gemma3ForConditionalGeneration's text model is a Gemma 3 text model under other names
    (transformers 5: model.language_model.*; 4.50 and saved folders: language_model.model.*);
    its vision tower and projector are left out, and the export is that text model."""
    text = {**_SMALL, **TINY["gemma3_text"]}
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration(config).eval()
    hf.config.architectures = [type(hf).__name__]
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    spec, state, report = import_hf(hf.config, state_dict=hf.state_dict())
    assert report.ignored and all(n.startswith(("model.vision_tower.", "model.multi_modal_projector."))
                                  for n in report.ignored)
    model = build_model(spec).eval()
    model.load_state_dict(state)
    ids, mask = _inputs()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=mask).logits
        ours = model(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=0)
    hf.save_pretrained(tmp_path / "saved")  # the names a folder on the Hub has
    assert any(n.startswith("language_model.model.") for n in read_hf_state_dict(tmp_path / "saved"))
    _, again, _ = import_hf(tmp_path / "saved")
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)
    from typer.testing import CliRunner

    from specformer.cli import app

    said = CliRunner().invoke(app, ["import-hf", str(tmp_path / "saved"), "-o", str(tmp_path / "g.yaml"),
                                    "-w", str(tmp_path / "g.safetensors")], env={"COLUMNS": "200"})
    assert said.exit_code == 0, said.output
    towers = sum(n.startswith("vision_tower.") for n in read_hf_state_dict(tmp_path / "saved"))
    assert f"the vision tower): multi_modal_projector.* (2 tensors), vision_tower.* ({towers} tensors)" in said.output
    save_hf(model.state_dict(), spec, tmp_path / "text", imported_as="gemma3")
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "text").eval()
    assert type(exported).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids, attention_mask=mask).logits[real], theirs[real],
                                   atol=1e-4, rtol=0)


def test_the_original_transformer_exports_as_marian(tmp_path) -> None:
    # transformer-base (Vaswani et al.) at a tiny size, its sinusoids in halves and Marian's
    # LayerNorm eps: a model trained from scratch that transformers loads as MarianMTModel
    from specformer.specs.loader import load_spec

    spec = load_spec("transformer-base", [
        "vocab_size=101", "d_model=32", "encoder={n_layers: 2, attention: {n_heads: 4}, ffn: {d_ff: 64}}",
        "decoder={n_layers: 2, attention: {n_heads: 4}, ffn: {d_ff: 64}}", "positional.layout=halves",
        "encoder.norm.eps=1e-5", "decoder.norm.eps=1e-5", "embedding.padding_idx=0", "max_seq_len=64"])
    torch.manual_seed(0)
    model = build_model(spec).eval()
    assert not model.embed.tokens.weight[0].any()  # the padding row starts at zero, as nn.Embedding's
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save_hf(model, spec, tmp_path)
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded).__name__ == "MarianMTModel" and not loaded.final_logits_bias.any()  # no head bias
    ids, mask = _inputs(seed=5)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits
        theirs = loaded(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5]).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_a_run_started_from_imported_xlm_roberta_weights_exports_as_xlm_roberta(tmp_path) -> None:
    """The model_type the weights record goes into the checkpoints of a run started from
    them (of its resumes, and of a run started from its checkpoint), so export-hf of the
    fine-tuned run is an XLM-R too."""
    import sysconfig

    from typer.testing import CliRunner

    from specformer.cli import app
    from specformer.specs.loader import load_spec
    from specformer.training import train

    config = transformers.AutoConfig.for_model("xlm-roberta", **{**TINY["xlm-roberta"], "vocab_size": 300})
    transformers.AutoModelForMaskedLM.from_config(config).save_pretrained(tmp_path / "hf")
    runner = CliRunner()
    spec_path, weights = tmp_path / "m.yaml", tmp_path / "m.safetensors"
    result = runner.invoke(app, ["import-hf", str(tmp_path / "hf"), "-o", str(spec_path), "-w", str(weights)])
    assert result.exit_code == 0, result.output
    text = str(sysconfig.get_paths()["stdlib"]) + "/json/*.py"
    spec = load_spec(spec_path, [f"training.data={{type: files, paths: ['{text}']}}", "training.tokenizer={type: byte}",
                                 "training.batch_size=2", "training.seq_len=16", "training.max_steps=1",
                                 "training.val_interval=1", "training.val_batches=1", "training.accelerator=cpu",
                                 "training.devices=1", "training.num_workers=0", f"training.out_dir={tmp_path / 'runs'}",
                                 f"training.cache_dir={tmp_path / 'cache'}"])
    first = train(spec, init_from=weights, progress=False)
    resumed = train(load_spec(spec.to_dict(), ["training.max_steps=2"]), resume=first.checkpoint, progress=False)
    again = train(load_spec(spec.to_dict(), ["name=again"]), init_from=resumed.checkpoint, progress=False)
    for run, out in ((first, "first"), (resumed, "resumed"), (again, "again")):
        result = runner.invoke(app, ["export-hf", str(run.checkpoint), "-o", str(tmp_path / out)])
        assert result.exit_code == 0, result.output
        config = json.loads((tmp_path / out / "config.json").read_text())
        assert (config["model_type"], config["architectures"]) == ("xlm-roberta", ["XLMRobertaForMaskedLM"])
        assert type(transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / out)).__name__ == "XLMRobertaForMaskedLM"
    # started from scratch, the same spec is RoBERTa's
    scratch = train(load_spec(spec.to_dict(), ["name=scratch"]), progress=False)
    result = runner.invoke(app, ["export-hf", str(scratch.checkpoint), "-o", str(tmp_path / "scratch")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "scratch" / "config.json").read_text())["model_type"] == "roberta"


def test_dynamic_ntk_matches_transformers_in_a_forward_and_in_cached_generation() -> None:
    # one forward of 60 positions (three times the original context of 20): the frequencies of
    # its last position for every position, as transformers computes them
    from specformer.training.generate import generate

    hf = _hf_model("llama-dynamic")
    spec, model = _imported(hf)
    assert spec.positional.scaling.model_dump() == {
        "type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 20}
    ids = torch.randint(3, V, (2, 60), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
        ours = model(ids).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    # transformers keeps the frequencies of its longest forward until one within the original
    # context: a fresh copy generates as a model that has read nothing yet
    hf = _hf_model("llama-dynamic")
    hf.generation_config.eos_token_id = None
    prompt = ids[:, :12]
    with torch.no_grad():
        out = hf.generate(input_ids=prompt, max_new_tokens=40, do_sample=False, num_beams=1, pad_token_id=0,
                          output_logits=True, return_dict_in_generate=True)
    # 40 greedy tokens with the cache, 31 of them from a step past position 20: the same tokens,
    # and each step's logits (the query and new key rotated at the step's length, cached keys as they were)
    tokens = generate(model, prompt, max_new_tokens=40, temperature=0.0, max_seq_len=64)
    assert torch.equal(tokens, out.sequences)
    _, steps = _greedy(model, spec, prompt, torch.ones_like(prompt), 40)
    torch.testing.assert_close(steps, torch.stack(out.logits, dim=1), atol=1e-4, rtol=0)
    assert len(set(tokens[0, 12:].tolist())) > 3
    # with a cache, each key keeps its step's rotation: the last logits differ from one forward
    # over the whole sequence, in both libraries alike
    with torch.no_grad():
        whole = model(out.sequences[:, :-1]).logits[:, -1]
    assert (whole - steps[:, -1]).abs().max() > 1e-2
    # the base grew past the original context: the same weights unscaled are another model
    plain = build_model(spec.model_copy(update={"positional": {**spec.positional.model_dump(), "scaling": None}}))
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (plain.eval()(ids).logits - theirs).abs().max() > 0.1
        # within the original context the frequencies are the plain ones, whatever came before;
        # the transformers copy that generated keeps its grown ones for a forward of 20 positions
        # (it returns to the plain ones below 20 only), a fresh one does not
        short = model(ids[:, :20]).logits
        torch.testing.assert_close(short, plain(ids[:, :20]).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(short, _hf_model("llama-dynamic")(input_ids=ids[:, :20]).logits, atol=1e-4, rtol=0)
        assert (hf(input_ids=ids[:, :20]).logits - short).abs().max() > 1e-2


def test_longrope_matches_transformers_in_a_forward_and_in_cached_generation() -> None:
    # one forward of 60 positions takes the long factors at every position; decoding with the
    # cache, the keys of the first 20 positions keep their short-factor rotation, as in transformers
    from specformer.training.generate import generate

    hf = _hf_model("llama-longrope")
    spec, model = _imported(hf)
    scaling = spec.positional.scaling
    assert (scaling.type, scaling.factor, scaling.original_max_position_embeddings) == ("longrope", 3.2, 20)
    assert scaling.attention_scale == pytest.approx(math.sqrt(1 + math.log(3.2) / math.log(20)))
    ids = torch.randint(3, V, (2, 60), generator=torch.Generator().manual_seed(5))
    hf.generation_config.eos_token_id = None
    prompt = ids[:, :12]
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
        short = hf(input_ids=ids[:, :20]).logits
        out = hf.generate(input_ids=prompt, max_new_tokens=40, do_sample=False, num_beams=1, pad_token_id=0,
                          output_logits=True, return_dict_in_generate=True)
        torch.testing.assert_close(model(ids).logits, theirs, atol=1e-4, rtol=0)
        torch.testing.assert_close(model(ids[:, :20]).logits, short, atol=1e-4, rtol=0)
    tokens = generate(model, prompt, max_new_tokens=40, temperature=0.0)
    assert torch.equal(tokens, out.sequences)
    _, steps = _greedy(model, spec, prompt, torch.ones_like(prompt), 40)
    torch.testing.assert_close(steps, torch.stack(out.logits, dim=1), atol=1e-4, rtol=0)
    assert len(set(tokens[0, 12:].tolist())) > 3
    with torch.no_grad():
        whole = model(out.sequences[:, :-1]).logits[:, -1]
    assert (whole - steps[:, -1]).abs().max() > 1e-2
    # the switch is what makes them agree: the short factors throughout are another model
    kept = spec.positional.model_copy(update={"scaling": scaling.model_copy(update={"long_factor": scaling.short_factor})})
    same = build_model(spec.model_copy(update={"positional": kept})).eval()
    same.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (same(ids).logits - theirs).abs().max() > 0.1


def test_a_windowed_model_with_dynamic_ntk_reads_a_long_prompt_in_one_forward_when_max_seq_len_covers_it() -> None:
    # by default a model with a window in every layer reads a prompt past max_seq_len in chunks, each
    # rotated with the frequencies of its own end (transformers reads it in one forward, all of it with
    # those of the prompt's end); a max_seq_len that covers prompt and new tokens gives its tokens
    from specformer.training.generate import generate

    config = transformers.MistralConfig(
        **_SMALL, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
        intermediate_size=64, head_dim=16, max_position_embeddings=8, sliding_window=6,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0})
    torch.manual_seed(0)
    hf = transformers.MistralForCausalLM(config).eval()
    hf.config.architectures = ["MistralForCausalLM"]
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    _, model = _imported(hf)
    ids = torch.randint(3, V, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    assert torch.equal(generate(model, ids, max_new_tokens=10, temperature=0.0, max_seq_len=30), theirs)
    assert not torch.equal(generate(model, ids, max_new_tokens=10, temperature=0.0), theirs)
