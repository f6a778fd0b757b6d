"""Hugging Face config <-> spec: the shipped presets are the published models, exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specformer.analysis import count_parameters
from specformer.interop.hf_config import (
    HFConversionError,
    export_family,
    hf_config_from_spec,
    hf_family,
    misspelt_config_keys,
    read_hf_config,
    spec_from_hf_config,
)
from specformer.specs.errors import SpecError
from specformer.specs.loader import load_spec

# The config.json files published with the original checkpoints on the Hugging Face Hub
# (gpt2, gpt2-medium, gpt2-large, gpt2-xl, bert-base-uncased, bert-large-uncased, t5-small,
# t5-base, meta-llama/Llama-2-7b-hf), architecture keys verbatim.
_GPT2 = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_positions": 1024,
    "resid_pdrop": 0.1, "vocab_size": 50257,
}
_BERT = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512, "model_type": "bert", "pad_token_id": 0,
    "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 30522,
}
_T5 = {
    "architectures": ["T5ForConditionalGeneration"], "d_kv": 64, "decoder_start_token_id": 0,
    "dropout_rate": 0.1, "eos_token_id": 1, "initializer_factor": 1.0, "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512, "pad_token_id": 0,
    "relative_attention_num_buckets": 32, "vocab_size": 32128,
}
# meta-llama/Meta-Llama-3-8B's config.json
_LLAMA3: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}

PUBLISHED: dict[str, dict[str, Any]] = {
    "gpt2-small": {**_GPT2, "n_embd": 768, "n_head": 12, "n_layer": 12},
    "gpt2-medium": {**_GPT2, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    "gpt2-large": {**_GPT2, "n_embd": 1280, "n_head": 20, "n_layer": 36},
    "gpt2-xl": {**_GPT2, "n_embd": 1600, "n_head": 25, "n_layer": 48},
    "bert-base": {**_BERT, "hidden_size": 768, "intermediate_size": 3072,
                  "num_attention_heads": 12, "num_hidden_layers": 12},
    "bert-large": {**_BERT, "hidden_size": 1024, "intermediate_size": 4096,
                   "num_attention_heads": 16, "num_hidden_layers": 24},
    "t5-small": {**_T5, "d_ff": 2048, "d_model": 512, "num_heads": 8, "num_layers": 6},
    "t5-base": {**_T5, "d_ff": 3072, "d_model": 768, "num_heads": 12, "num_layers": 12},
    "llama2-7b": {
        "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": 32000,
    },
    "llama3-8b": _LLAMA3,
    "llama3.1-8b": {
        **_LLAMA3, "max_position_embeddings": 131072, "mlp_bias": False,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
}

# Other families: the published configs of roberta-base, mistralai/Mistral-7B-v0.1,
# EleutherAI/pythia-160m, google/t5-v1_1-small, facebook/bart-base, Qwen/Qwen2.5-0.5B,
# Qwen/Qwen3-0.6B, Phi-3-mini and gemma-2b (all but pythia, T5 v1.1, Phi-3 and Gemma also shipped
# as presets: SHIPPED).
OTHERS: dict[str, dict[str, Any]] = {
    "starcoderbase-1b": {
        "activation_function": "gelu_pytorch_tanh", "architectures": ["GPTBigCodeForCausalLM"],
        "attention_softmax_in_fp32": True, "attn_pdrop": 0.1, "bos_token_id": 0, "embd_pdrop": 0.1,
        "eos_token_id": 0, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt_bigcode",
        "multi_query": True, "n_embd": 2048, "n_head": 16, "n_inner": 8192, "n_layer": 24, "n_positions": 8192,
        "resid_pdrop": 0.1, "scale_attention_softmax_in_fp32": True, "scale_attn_weights": True,
        "vocab_size": 49152,
    },
    # allenai/OLMo-1B-hf's config.json
    "olmo-1b": {
        "architectures": ["OlmoForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": None, "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 2048,
        "model_type": "olmo", "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16,
        "pad_token_id": 1, "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": True,
        "torch_dtype": "float32", "use_cache": True, "vocab_size": 50304,
    },
    "olmo-2-1124-7b": {
        "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
        "torch_dtype": "float32", "use_cache": True, "vocab_size": 100352,
    },
    "bloom-560m": {
        "apply_residual_connection_post_layernorm": False, "architectures": ["BloomForCausalLM"],
        "attention_dropout": 0.0, "attention_softmax_in_fp32": True, "bias_dropout_fusion": True,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_dropout": 0.0, "hidden_size": 1024,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "masked_softmax_fusion": True,
        "model_type": "bloom", "n_head": 16, "n_inner": None, "n_layer": 24, "offset_alibi": 100,
        "pad_token_id": 3, "pretraining_tp": 1, "skip_bias_add": True, "skip_bias_add_qkv": False,
        "slow_but_exact": False, "unk_token_id": 0, "use_cache": True, "vocab_size": 250880,
    },
    "opt-125m": {
        "activation_dropout": 0.0, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
        "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": True, "dropout": 0.1,
        "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768, "init_std": 0.02, "layerdrop": 0.0,
        "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
        "num_hidden_layers": 12, "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16",
        "use_cache": True, "vocab_size": 50272, "word_embed_proj_dim": 768,
    },
    "distilbert-base-uncased": {
        "activation": "gelu", "architectures": ["DistilBertForMaskedLM"], "attention_dropout": 0.1,
        "dim": 768, "dropout": 0.1, "hidden_dim": 3072, "initializer_range": 0.02,
        "max_position_embeddings": 512, "model_type": "distilbert", "n_heads": 12, "n_layers": 6,
        "pad_token_id": 0, "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False,
        "tie_weights_": True, "vocab_size": 30522,
    },
    # transformers' default sentiment-analysis model
    "distilbert-base-uncased-finetuned-sst-2-english": {
        "activation": "gelu", "architectures": ["DistilBertForSequenceClassification"],
        "attention_dropout": 0.1, "dim": 768, "dropout": 0.1, "finetuning_task": "sst-2", "hidden_dim": 3072,
        "id2label": {"0": "NEGATIVE", "1": "POSITIVE"}, "initializer_range": 0.02,
        "label2id": {"NEGATIVE": 0, "POSITIVE": 1}, "max_position_embeddings": 512, "model_type": "distilbert",
        "n_heads": 12, "n_layers": 6, "output_past": True, "pad_token_id": 0, "qa_dropout": 0.1,
        "seq_classif_dropout": 0.2, "sinusoidal_pos_embds": False, "tie_weights_": True, "vocab_size": 30522,
    },
    "bart-base": {
        "activation_dropout": 0.1, "activation_function": "gelu", "add_bias_logits": False,
        "add_final_layer_norm": False, "architectures": ["BartModel"], "attention_dropout": 0.1,
        "bos_token_id": 0, "d_model": 768, "decoder_attention_heads": 12, "decoder_ffn_dim": 3072,
        "decoder_layers": 6, "decoder_start_token_id": 2, "dropout": 0.1, "encoder_attention_heads": 12,
        "encoder_ffn_dim": 3072, "encoder_layers": 6, "eos_token_id": 2, "forced_eos_token_id": 2,
        "init_std": 0.02, "is_encoder_decoder": True, "max_position_embeddings": 1024,
        "model_type": "bart", "normalize_before": False, "normalize_embedding": True,
        "pad_token_id": 1, "scale_embedding": False, "vocab_size": 50265,
    },
    "roberta-base": {
        "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "type_vocab_size": 1, "vocab_size": 50265,
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "vocab_size": 32000,
    },
    "pythia-160m": {
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu", "hidden_size": 768, "initializer_range": 0.02,
        "intermediate_size": 3072, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 12, "num_hidden_layers": 12,
        "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "use_cache": True, "use_parallel_residual": True, "vocab_size": 50304,
    },
    "t5-v1_1-small": {
        "architectures": ["T5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64, "d_model": 512,
        "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
        "layer_norm_epsilon": 1e-06, "model_type": "t5", "num_decoder_layers": 8, "num_heads": 6,
        "num_layers": 8, "output_past": True, "pad_token_id": 0,
        "relative_attention_num_buckets": 32, "tie_word_embeddings": False, "vocab_size": 32128,
    },
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "use_cache": True, "use_mrope": False, "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
        "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
    # microsoft/Phi-3-mini-4k-instruct: a window of 2047 on every layer
    "phi3-mini-4k": {
        "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
        "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
        "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32064,
    },
    # google/gemma-2b
    "gemma-2b": {
        "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 16384, "max_position_embeddings": 8192, "model_type": "gemma",
        "num_attention_heads": 8, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
        "use_cache": True, "vocab_size": 256000,
    },
    # microsoft/phi-2 and microsoft/phi-1_5: one LayerNorm per parallel block, partial rotary
    "phi-2": {
        "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 50256,
        "embd_pdrop": 0.0, "eos_token_id": 50256, "hidden_act": "gelu_new", "hidden_size": 2560,
        "initializer_range": 0.02, "intermediate_size": 10240, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "partial_rotary_factor": 0.4,
        "qk_layernorm": False, "resid_pdrop": 0.1, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True, "vocab_size": 51200,
    },
    "phi-1_5": {
        "architectures": ["PhiForCausalLM"], "attention_dropout": 0.0, "bos_token_id": None,
        "embd_pdrop": 0.0, "eos_token_id": None, "hidden_act": "gelu_new", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048, "model_type": "phi", "num_attention_heads": 32,
        "num_hidden_layers": 24, "num_key_value_heads": None, "partial_rotary_factor": 0.5,
        "qk_layernorm": False, "resid_pdrop": 0.0, "rope_scaling": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True, "vocab_size": 51200,
    },
    # EleutherAI/gpt-j-6b: interleaved rotary over 64 of each head's 256 features
    "gpt-j-6b": {
        "activation_function": "gelu_new", "architectures": ["GPTJForCausalLM"], "attn_pdrop": 0.0,
        "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "gradient_checkpointing": False,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gptj", "n_embd": 4096,
        "n_head": 16, "n_inner": None, "n_layer": 28, "n_positions": 2048, "resid_pdrop": 0.0,
        "rotary": True, "rotary_dim": 64, "scale_attn_weights": True, "tie_word_embeddings": False,
        "tokenizer_class": "GPT2Tokenizer", "use_cache": True, "vocab_size": 50400,
    },
    # tiiuae/falcon-7b (one key/value head, one norm per parallel block) and tiiuae/falcon-40b
    # (8 key/value groups, a norm for each branch)
    "falcon-7b": {
        "alibi": False, "apply_residual_connection_post_layernorm": False, "architectures": ["FalconForCausalLM"],
        "attention_dropout": 0.0, "bias": False, "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0,
        "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
        "multi_query": True, "new_decoder_architecture": False, "num_attention_heads": 71,
        "num_hidden_layers": 32, "parallel_attn": True, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 65024,
    },
    "falcon-40b": {
        "alibi": False, "architectures": ["FalconForCausalLM"], "attention_dropout": 0.0, "bias": False,
        "bos_token_id": 11, "eos_token_id": 11, "hidden_dropout": 0.0, "hidden_size": 8192,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "falcon",
        "new_decoder_architecture": True, "num_attention_heads": 128, "num_hidden_layers": 60,
        "num_kv_heads": 8, "parallel_attn": True, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 65024,
    },
    # google/gemma-2-2b: sandwich norms, soft-capped scores (50) and logits (30), a window on
    # every other layer
    "gemma-2-2b": {
        "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
        "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
        "torch_dtype": "float32", "vocab_size": 256000,
    },
    # google/gemma-3-1b-pt (transformers 4.50's keys): query and key norms, five windowed layers
    # (512, rotating with base 1e4) to one global (1e6), no caps
    "gemma-3-1b": {
        "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152, "initializer_range": 0.02, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
        "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 262144,
    },
    # bigcode/starcoder2-3b: grouped keys, biases, a window of 4096 on every layer
    "starcoder2-3b": {
        "architectures": ["Starcoder2ForCausalLM"], "attention_dropout": 0.1, "residual_dropout": 0.1,
        "embedding_dropout": 0.1, "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 3072, "initializer_range": 0.018042, "intermediate_size": 12288, "norm_epsilon": 1e-05,
        "max_position_embeddings": 16384, "mlp_type": "default", "model_type": "starcoder2",
        "num_attention_heads": 24, "num_hidden_layers": 30, "num_key_value_heads": 2,
        "rope_theta": 999999.4420358813, "sliding_window": 4096, "torch_dtype": "float32", "use_bias": True,
        "use_cache": True, "vocab_size": 49152,
    },
    # T5 v1.1's and RoBERTa's models under other names
    "mt5-small": {
        "architectures": ["MT5ForConditionalGeneration"], "d_ff": 1024, "d_kv": 64, "d_model": 512,
        "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1,
        "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
        "layer_norm_epsilon": 1e-06, "model_type": "mt5", "num_decoder_layers": 8, "num_heads": 6,
        "num_layers": 8, "pad_token_id": 0, "relative_attention_num_buckets": 32,
        "tie_word_embeddings": False, "tokenizer_class": "T5Tokenizer", "vocab_size": 250112,
    },
    "xlm-roberta-base": {
        "architectures": ["XLMRobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "xlm-roberta",
        "num_attention_heads": 12, "num_hidden_layers": 12, "output_past": True, "pad_token_id": 1,
        "position_embedding_type": "absolute", "type_vocab_size": 1, "vocab_size": 250002,
    },
}

# every preset that is a published model, with its config
SHIPPED: dict[str, dict[str, Any]] = {**PUBLISHED, **{n: OTHERS[n] for n in ("bart-base", "gemma-2-2b", "gemma-3-1b",
                                                          "mistral-7b", "phi-2",
                                                          "qwen2.5-0.5b", "qwen3-0.6b",
                                                          "roberta-base")}}

_AUTO_CLASS = {"decoder": "AutoModelForCausalLM", "encoder": "AutoModelForMaskedLM",
               "encoder-decoder": "AutoModelForSeq2SeqLM"}


def _hf_meta_model(config: dict[str, Any]) -> tuple[Any, Any]:
    """The transformers config object and its model with the task head, on the meta device."""
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    import torch

    hf_config = transformers.AutoConfig.for_model(**config)
    kind = "encoder-decoder" if hf_config.is_encoder_decoder else (
        "decoder" if hf_config.model_type in ("gpt2", "gpt_bigcode", "opt", "bloom", "olmo", "olmo2", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gpt_neox",
                                              "phi", "gptj", "falcon", "gemma2", "gemma3_text", "starcoder2")
        else "encoder")
    auto = _AUTO_CLASS[kind]
    if any(name.endswith("ForSequenceClassification") for name in hf_config.architectures or ()):
        auto = "AutoModelForSequenceClassification"
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(hf_config)
    return hf_config, model


def _refused(call: Any, words: list[str]) -> str:
    """``call()`` raises HFConversionError whose message holds every one of ``words``; the message."""
    with pytest.raises(HFConversionError) as info:
        call()
    for word in words:
        assert word in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("preset", sorted(SHIPPED))
def test_published_config_is_the_preset(preset: str) -> None:
    assert spec_from_hf_config(SHIPPED[preset], name=preset) == load_spec(preset)


@pytest.mark.parametrize("preset", sorted(SHIPPED))
def test_transformers_config_object_is_the_preset(preset: str) -> None:
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    config = transformers.AutoConfig.for_model(**SHIPPED[preset])
    assert spec_from_hf_config(config, name=preset) == load_spec(preset)


@pytest.mark.parametrize("name", sorted(PUBLISHED) + sorted(OTHERS))
def test_parameter_count_equals_hugging_face_on_meta(name: str) -> None:
    # the spec of the config object transformers builds from (transformers 5 ties T5
    # v1.1's output layer unless a checkpoint brings a separate one)
    hf_config, hf_model = _hf_meta_model(PUBLISHED.get(name) or OTHERS[name])
    spec = spec_from_hf_config(hf_config)
    expected = sum(p.numel() for p in hf_model.parameters())
    assert count_parameters(spec).total == expected
    try:
        from specformer.builder import build_model
    except ImportError:
        return
    model = build_model(spec, device="meta")
    assert sum(p.numel() for p in model.parameters()) == expected


def test_published_parameter_counts() -> None:
    # the sizes the model cards and papers quote
    assert count_parameters(spec_from_hf_config(PUBLISHED["gpt2-small"])).total == 124_439_808
    assert count_parameters(spec_from_hf_config(PUBLISHED["llama2-7b"])).total == 6_738_415_616


def test_opt_is_a_decoder_with_positions_offset_by_two_at_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["opt-125m"])
    assert (spec.positional.type, spec.positional.offset, spec.positional.rows(spec.max_seq_len)) == ("learned", 2, 2050)
    assert spec.decoder.ffn.activation == "relu" and spec.embedding.dropout == 0.0
    assert count_parameters(spec).total == 125_239_296  # the "125M" of the OPT paper's table
    # OPT-350m projects its 512-wide embeddings to the model's 1024, and is post-norm
    _refused(lambda: spec_from_hf_config({**OTHERS["opt-125m"], "hidden_size": 1024, "word_embed_proj_dim": 512,
                                          "do_layer_norm_before": False}),
             ["word_embed_proj_dim=512", "projection between the embeddings and the model width"])
    post = spec_from_hf_config({**OTHERS["opt-125m"], "do_layer_norm_before": False})
    assert post.decoder.norm.placement == "post" and not post.decoder.final_norm
    _refused(lambda: spec_from_hf_config({**OTHERS["opt-125m"], "layerdrop": 0.1}), ["layerdrop=0.1"])


def test_a_decoder_whose_positions_start_two_rows_in_exports_as_opt() -> None:
    # (the table's size and OPT's init written out, as an import writes them)
    spec = load_spec("gpt-nano", ["positional={type: learned, offset: 2, max_positions: 258}",
                                  "embedding.dropout=0", "init.scaled_residual=false"])
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["max_position_embeddings"]) == ("opt", spec.max_seq_len)
    assert spec_from_hf_config(config, name=spec.name).model_copy(update={"training": spec.training}) == spec


def test_bloom_is_an_alibi_decoder_with_an_embedding_norm_at_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["bloom-560m"])
    assert (spec.positional.type, spec.max_seq_len, spec.decoder.ffn.d_ff) == ("alibi", 2048, 4096)
    assert spec.embedding.norm is not None and spec.decoder.ffn.activation == "gelu_tanh"
    assert count_parameters(spec).total == 559_214_592  # the model card's
    # the 176B model's config names its width n_embed
    big = {k: v for k, v in OTHERS["bloom-560m"].items() if k != "hidden_size"} | {"n_embed": 14336, "n_head": 112}
    assert spec_from_hf_config(big).d_model == 14336
    _refused(lambda: spec_from_hf_config({**OTHERS["bloom-560m"], "apply_residual_connection_post_layernorm": True}),
             ["apply_residual_connection_post_layernorm=True", "residual stream taken after"])


def test_misspelt_keys_are_named_and_published_configs_have_none() -> None:
    llama = {"model_type": "llama", "hidden_size": 64, "num_atention_heads": 4, "rms_norm_epsilon": 1e-5}
    assert misspelt_config_keys(llama) == [
        "config key 'num_atention_heads' is not a llama setting: did you mean 'num_attention_heads'? "
        "(its default was taken)",
        "config key 'rms_norm_epsilon' is not a llama setting: did you mean 'rms_norm_eps'? (its default was taken)",
    ]
    # a key the config has is not "missing", and unrelated extra keys are not typos
    assert misspelt_config_keys({**llama, "num_attention_heads": 4, "rms_norm_eps": 1e-5}) == []
    for config in [*SHIPPED.values(), *OTHERS.values()]:
        assert misspelt_config_keys(config) == [], config["model_type"]


def test_bloom_slow_but_exact_with_tensor_parallel_slices_is_refused() -> None:
    # transformers' slices leave out the output projections' biases: importing them would differ
    _refused(lambda: spec_from_hf_config({**OTHERS["bloom-560m"], "pretraining_tp": 2, "slow_but_exact": True}),
             ["slow_but_exact=True with pretraining_tp=2", "dense_4h_to_h"])
    for ok in ({"pretraining_tp": 4, "slow_but_exact": False}, {"pretraining_tp": 1, "slow_but_exact": True}):
        assert spec_from_hf_config({**OTHERS["bloom-560m"], **ok}).positional.type == "alibi"


def test_an_alibi_decoder_exports_as_bloom() -> None:
    alibi = ["positional={type: alibi}", "decoder.ffn.d_ff=512", "init.scaled_residual=false"]
    _refused(lambda: hf_config_from_spec(load_spec("gpt-nano", alibi)),
             ["no Hugging Face bloom equivalent", "embedding.norm = None"])
    spec = load_spec("gpt-nano", [*alibi, "embedding.norm={type: layernorm}", "embedding.dropout=0"])
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["seq_length"]) == ("bloom", spec.max_seq_len)
    assert spec_from_hf_config(config, name=spec.name).model_copy(update={"training": spec.training}) == spec


# the multimodal Gemma 3 4B's published config.json (vision_config abridged to what it sets)
_GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3", "torch_dtype": "bfloat16",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                    "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False},
}


def test_the_multimodal_gemma3_config_imports_its_text_model() -> None:
    spec = spec_from_hf_config(_GEMMA3_4B)
    assert spec.name == "gemma3"
    assert spec == spec_from_hf_config(_GEMMA3_4B["text_config"], name="gemma3")  # its text model's own config
    assert (spec.decoder.n_layers, spec.positional.local_base, spec.positional.scaling.factor) == (34, 1e4, 8.0)
    # the parameters of transformers' text model alone (Gemma3ForCausalLM), built on meta
    _, text_model = _hf_meta_model(_GEMMA3_4B["text_config"])
    assert type(text_model).__name__ == "Gemma3ForCausalLM"
    assert count_parameters(spec).total == sum(p.numel() for p in text_model.parameters())
    _refused(lambda: spec_from_hf_config({**_GEMMA3_4B, "architectures": ["Gemma3ForSequenceClassification"]}),
             ["Gemma3ForSequenceClassification", "text model of gemma3's Gemma3ForConditionalGeneration"])


def test_olmo2_normalises_sublayer_outputs_and_whole_projections_at_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["olmo-2-1124-7b"])
    assert spec.decoder.norm.placement == "output" and spec.decoder.final_norm
    assert (spec.decoder.attention.qk_norm, spec.decoder.attention.qk_norm_scope) == ("rmsnorm", "all")
    assert count_parameters(spec).total == 7_298_617_344  # OLMo 2 7B's
    # its query and key norms take rms_norm_eps too (the config class's default is 1e-5)
    other = spec_from_hf_config({**OTHERS["olmo-2-1124-7b"], "rms_norm_eps": 1e-5})
    assert other.decoder.norm.eps == other.decoder.attention.qk_norm_eps == 1e-5


def test_olmo_has_layernorms_without_parameters_at_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["olmo-1b"])
    norm = spec.decoder.norm
    assert (norm.type, norm.weight, norm.bias, norm.eps, norm.placement) == ("layernorm", False, False, 1e-5, "pre")
    assert count_parameters(spec).total == 1_176_764_416  # OLMo 1B's, tied: no norm has a parameter
    config = hf_config_from_spec(spec, warnings=[])
    assert (config["model_type"], config["architectures"], config["clip_qkv"]) == ("olmo", ["OlmoForCausalLM"], None)
    assert spec_from_hf_config(config, name=spec.name) == spec
    # OLMo's LayerNorms take no eps from the config: another is refused on export, by name
    _refused(lambda: hf_config_from_spec(load_spec("llama-nano", ["decoder.norm={type: layernorm, weight: false, "
                                                                  "bias: false, eps: 1e-6}"])),
             ["decoder.norm.eps"])


def test_a_decoder_with_output_norms_exports_as_olmo2() -> None:
    olmo = ["decoder.norm.placement=output", "decoder.norm.eps=1e-6", "decoder.attention.qk_norm=rmsnorm",
            "decoder.attention.qk_norm_scope=all"]
    spec = load_spec("llama-nano", olmo)
    config = hf_config_from_spec(spec, warnings=[])
    assert (config["model_type"], config["architectures"]) == ("olmo2", ["Olmo2ForCausalLM"])
    back = spec_from_hf_config(config, name=spec.name)
    assert back.decoder == spec.decoder and back.positional == spec.positional
    _refused(lambda: hf_config_from_spec(load_spec("llama-nano", olmo[:3])),
             ["decoder.attention.qk_norm_scope = 'head' (Hugging Face olmo2 has 'all')"])


# Helsinki-NLP/opus-mt-en-de's published config.json
_OPUS_MT_EN_DE = {
    "activation_dropout": 0.0, "activation_function": "swish", "add_bias_logits": False,
    "add_final_layer_norm": False, "architectures": ["MarianMTModel"], "attention_dropout": 0.0,
    "bad_words_ids": [[58100]], "bos_token_id": 0, "classif_dropout": 0.0, "classifier_dropout": 0.0,
    "d_model": 512, "decoder_attention_heads": 8, "decoder_ffn_dim": 2048, "decoder_layerdrop": 0.0,
    "decoder_layers": 6, "decoder_start_token_id": 58100, "decoder_vocab_size": 58101, "dropout": 0.1,
    "encoder_attention_heads": 8, "encoder_ffn_dim": 2048, "encoder_layerdrop": 0.0, "encoder_layers": 6,
    "eos_token_id": 0, "forced_eos_token_id": 0, "init_std": 0.02, "is_encoder_decoder": True, "max_length": 512,
    "max_position_embeddings": 512, "model_type": "marian", "normalize_before": False,
    "normalize_embedding": False, "num_beams": 4, "num_hidden_layers": 6, "pad_token_id": 58100,
    "scale_embedding": True, "share_encoder_decoder_embeddings": True, "static_position_embeddings": True,
    "use_cache": True, "vocab_size": 58101,
}


def test_marian_is_the_original_transformer_with_sinusoids_in_halves() -> None:
    spec = spec_from_hf_config(_OPUS_MT_EN_DE)
    assert (spec.positional.type, spec.positional.layout, spec.embedding.scale) == ("sinusoidal", "halves", True)
    assert spec.encoder.norm.placement == "post" and spec.encoder.ffn.activation == "silu"
    assert spec.head.bias and spec.embedding.padding_idx == 58100
    # transformers' parameters hold the fixed sinusoids (not trained) and its output bias is a
    # buffer; specformer's head bias is a parameter and sinusoids have none
    _, hf_model = _hf_meta_model({**_OPUS_MT_EN_DE, "architectures": None})
    trained = sum(p.numel() for p in hf_model.parameters() if p.requires_grad)
    assert count_parameters(spec).total == trained + _OPUS_MT_EN_DE["vocab_size"]
    assert sum(p.numel() for p in hf_model.parameters()) == 74_410_496  # the model card's 74.4M
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["pad_token_id"], config["decoder_start_token_id"]) == ("marian", 58100, 58100)
    assert spec_from_hf_config(config, name=spec.name) == spec
    _refused(lambda: spec_from_hf_config({**_OPUS_MT_EN_DE, "share_encoder_decoder_embeddings": False}),
             ["share_encoder_decoder_embeddings=False", "decoder vocabulary of its own"])
    # without a padding token transformers cannot build it: the export says so
    _refused(lambda: hf_config_from_spec(load_spec(spec.to_dict(), ["embedding.padding_idx=null"])),
             ["marian needs a padding token", "embedding.padding_idx"])


def test_distilbert_is_bert_without_token_types_at_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["distilbert-base-uncased"])
    assert spec.kind == "encoder" and spec.embedding.segment_vocab_size == 0
    assert (spec.encoder.n_layers, spec.d_model, spec.encoder.ffn.d_ff) == (6, 768, 3072)
    assert spec.encoder.norm.placement == "post" and spec.encoder.norm.eps == 1e-12
    counts = count_parameters(spec)
    # the paper's 66M: DistilBertModel's 66,362,880, then the masked-LM transform and bias
    assert counts.total - (768 * 768 + 768) - 2 * 768 - 30522 == 66_362_880
    sst2 = spec_from_hf_config(OTHERS["distilbert-base-uncased-finetuned-sst-2-english"])
    assert sst2.head.type == "classification" and sst2.head.pooler_activation == "relu"
    assert (sst2.head.labels, sst2.head.dropout) == (("NEGATIVE", "POSITIVE"), 0.2)
    _refused(lambda: spec_from_hf_config({**OTHERS["distilbert-base-uncased"], "sinusoidal_pos_embds": True}),
             ["sinusoidal_pos_embds=True", "does not train"])


def test_an_encoder_without_segments_exports_as_distilbert() -> None:
    # BERT's embeddings add a token-type row whatever the input: one without is DistilBERT
    _refused(lambda: hf_config_from_spec(load_spec("bert-nano", ["embedding.segment_vocab_size=0",
                                                                 "encoder.norm.eps=1e-5"])),
             ["Hugging Face distilbert", "encoder.norm.eps = 1e-05 (Hugging Face distilbert has 1e-12)",
              "--set encoder.norm.eps=1e-12"])
    spec = load_spec("bert-nano", ["embedding.segment_vocab_size=0"])
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["architectures"]) == ("distilbert", ["DistilBertForMaskedLM"])
    assert spec_from_hf_config(config, name=spec.name).model_copy(update={"training": spec.training}) == spec
    cls = load_spec(spec.to_dict(), ["head={type: classification, pooler_activation: relu, labels: [bad, good]}"])
    config = hf_config_from_spec(cls)
    assert config["architectures"] == ["DistilBertForSequenceClassification"]
    assert config["id2label"] == {"0": "bad", "1": "good"}
    assert spec_from_hf_config(config, name=spec.name).model_copy(update={"training": cls.training}) == cls
    _refused(lambda: hf_config_from_spec(load_spec(spec.to_dict(), ["head={type: classification}"])),
             ["head.pooler_activation = 'tanh' (Hugging Face distilbert has 'relu')"])


def test_roberta_positions_are_offset_by_the_padding_index() -> None:
    spec = spec_from_hf_config(OTHERS["roberta-base"])
    assert (spec.positional.type, spec.positional.offset, spec.positional.max_positions) == ("learned", 2, 514)
    assert spec.max_seq_len == 512
    assert spec.embedding.segment_vocab_size == 1
    assert spec.encoder.norm.eps == 1e-5 and spec.head.eps == 1e-5


def test_phi3_mini_is_a_windowed_llama_of_its_published_size() -> None:
    spec = spec_from_hf_config(OTHERS["phi3-mini-4k"])
    att = spec.decoder.attention
    assert (att.n_heads, att.n_kv_heads, att.head_dim, att.sliding_window, att.bias) == (32, 32, 96, 2047, False)
    assert spec.decoder.norm.eps == 1e-5 and spec.positional.fraction == 1.0
    assert count_parameters(spec).total == 3_821_079_552  # the model card's 3.8B
    # every feature rotates: the structure is a Mistral's, and the weights go back as Phi-3's
    assert hf_config_from_spec(spec)["model_type"] == "mistral"
    assert hf_config_from_spec(spec, imported_as="phi3")["model_type"] == "phi3"
    partial = spec_from_hf_config({**OTHERS["phi3-mini-4k"], "partial_rotary_factor": 0.75})
    assert partial.positional.fraction == 0.75 and hf_config_from_spec(partial)["model_type"] == "phi3"


def test_gemma_has_unit_offset_norms_scaled_embeddings_and_tanh_gates() -> None:
    spec = spec_from_hf_config(OTHERS["gemma-2b"])
    assert spec.decoder.norm.offset == 1.0 and spec.embedding.scale and spec.embedding.tie_output
    assert (spec.decoder.ffn.activation, spec.decoder.attention.head_dim, spec.decoder.attention.n_kv_heads) == (
        "gelu_tanh", 256, 1)
    assert count_parameters(spec).total == 2_506_172_416  # gemma-2b's published count
    assert hf_config_from_spec(spec)["model_type"] == "gemma"
    # a Llama's norms with a unit offset are Gemma's, whose embeddings are scaled
    _refused(lambda: hf_config_from_spec(load_spec("llama2-7b", ["decoder.norm.offset=1"])),
             ["gemma", "embedding.scale = False (Hugging Face gemma has True)"])


def test_phi_and_gptj_share_one_norm_per_parallel_block_at_their_published_sizes() -> None:
    phi2 = spec_from_hf_config(OTHERS["phi-2"])
    layer = phi2.decoder.layer(0)
    assert (layer.residual.type, layer.residual.shared_norm, phi2.positional.fraction) == ("parallel", True, 0.4)
    assert layer.attention.bias and layer.attention.head_dim == 80 and phi2.head.bias
    assert count_parameters(phi2).total == 2_779_683_840  # Phi-2's 2.7B
    assert count_parameters(spec_from_hf_config(OTHERS["phi-1_5"])).total == 1_418_270_720  # Phi-1.5's 1.3B
    gptj = spec_from_hf_config(OTHERS["gpt-j-6b"])
    assert not gptj.decoder.attention.bias and gptj.decoder.attention.head_dim == 256
    assert int(256 * gptj.positional.fraction) == 64 and gptj.decoder.residual.shared_norm
    assert count_parameters(gptj).total == 6_050_882_784  # GPT-J's 6B
    # each exports as its own family: attention biases tell the two apart
    assert hf_config_from_spec(phi2)["model_type"] == "phi"
    config = hf_config_from_spec(gptj)
    assert (config["model_type"], config["rotary_dim"]) == ("gptj", 64)
    # one norm per parallel block has no GPT-NeoX form, nor a sequential block a shared one
    neox = spec_from_hf_config(OTHERS["pythia-160m"])
    assert hf_family(neox.model_copy(update={"decoder": neox.decoder.model_copy(update={
        "residual": neox.decoder.residual.model_copy(update={"shared_norm": True})})})) == "phi"
    with pytest.raises(SpecError, match="decoder.residual.shared_norm"):
        load_spec("gpt2-small", ["decoder.residual.shared_norm=true"])


def test_falcon_7b_and_40b_layouts() -> None:
    f7 = spec_from_hf_config(OTHERS["falcon-7b"])
    att, layer = f7.decoder.attention, f7.decoder.layer(0)
    assert (att.n_heads, att.n_kv_heads, att.head_dim, att.bias) == (71, 1, 64, False)
    assert (layer.residual.type, layer.residual.shared_norm) == ("parallel", True)
    assert f7.embedding.tie_output and not f7.head.bias and f7.decoder.ffn.activation == "gelu"
    assert count_parameters(f7).total == 6_921_720_704  # Falcon-7B's 6.9B
    config = hf_config_from_spec(f7)
    assert (config["model_type"], config["multi_query"], config["new_decoder_architecture"]) == ("falcon", True, False)
    f40 = spec_from_hf_config(OTHERS["falcon-40b"])
    assert (f40.decoder.attention.n_kv_heads, f40.decoder.residual.shared_norm) == (8, False)
    config = hf_config_from_spec(f40)
    assert (config["new_decoder_architecture"], config["num_ln_in_parallel_attn"], config["num_kv_heads"]) == (
        True, 2, 8)
    # refused by name: ALiBi (Falcon-RW), and the combinations transformers computes wrongly
    _refused(lambda: spec_from_hf_config({**OTHERS["falcon-7b"], "alibi": True}), ["alibi=True"])
    _refused(lambda: spec_from_hf_config({**OTHERS["falcon-40b"], "parallel_attn": False}),
             ["new_decoder_architecture=True with parallel_attn=False"])
    _refused(lambda: spec_from_hf_config({**OTHERS["falcon-7b"], "num_ln_in_parallel_attn": 2}),
             ["num_ln_in_parallel_attn=2"])
    # a Falcon with a key/value head per query head has GPT-NeoX's structure: its weights go back as Falcon's
    mha = spec_from_hf_config({**OTHERS["falcon-7b"], "multi_query": False, "parallel_attn": False,
                               "bias": True, "num_attention_heads": 71})
    assert hf_config_from_spec(mha, imported_as="falcon")["model_type"] == "falcon"


def test_gemma2_has_sandwich_norms_soft_caps_and_alternating_windows() -> None:
    spec = spec_from_hf_config(OTHERS["gemma-2-2b"])
    s = spec.decoder
    assert (s.norm.placement, s.norm.offset, s.attention.softcap, spec.head.softcap) == ("sandwich", 1.0, 50.0, 30.0)
    assert s.attention.scale is None  # query_pre_attn_scalar 256 is head_dim
    assert [s.layer(i).attention.sliding_window for i in range(4)] == [4096, None, 4096, None]
    assert count_parameters(spec).total == 2_614_341_888  # gemma-2-2b's 2.6B
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["query_pre_attn_scalar"], config["attn_logit_softcapping"],
            config["final_logit_softcapping"]) == ("gemma2", 256, 50.0, 30.0)
    assert config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    # another scalar (Gemma 2 27B's 144 with head_dim 128) is the softmax scale, and exports back as written
    other = spec_from_hf_config({**OTHERS["gemma-2-2b"], "head_dim": 128, "query_pre_attn_scalar": 144})
    assert other.decoder.attention.scale == 144 ** -0.5
    assert hf_config_from_spec(other)["query_pre_attn_scalar"] == 144
    # a Gemma without sandwich norms or caps is the first Gemma
    first = spec_from_hf_config({**OTHERS["gemma-2-2b"], "attn_logit_softcapping": None,
                                 "final_logit_softcapping": None})
    assert hf_family(first) == "gemma2"  # its sandwich norms still say Gemma 2
    _refused(lambda: hf_config_from_spec(load_spec("llama2-7b", ["decoder.norm.placement=sandwich"])),
             ["llama", "decoder.norm.placement = 'sandwich'"])


def test_gemma3_has_qk_norms_and_a_base_of_its_windowed_layers_own() -> None:
    spec = spec_from_hf_config(OTHERS["gemma-3-1b"])
    s = spec.decoder
    assert (s.attention.qk_norm, s.attention.qk_norm_offset, s.norm.placement) == ("rmsnorm", 1.0, "sandwich")
    assert (spec.positional.base, spec.positional.local_base) == (1e6, 1e4)
    assert [s.layer(i).attention.sliding_window for i in range(7)] == [512] * 5 + [None, 512]
    assert s.attention.softcap is None and spec.head.softcap is None
    assert count_parameters(spec).total == 999_885_952  # gemma-3-1b's 1B
    config = hf_config_from_spec(spec)
    assert config["model_type"] == "gemma3_text" and config["rope_parameters"] == {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    # transformers 5's keys (rope_parameters per layer type, layer_types) give the same spec
    assert spec_from_hf_config(config, name="gemma-3-1b") == spec_from_hf_config(OTHERS["gemma-3-1b"], name="gemma-3-1b")
    assert spec_from_hf_config({**OTHERS["gemma-3-1b"], "rms_norm_eps": 1e-5}).decoder.attention.qk_norm_eps == 1e-5
    _refused(lambda: spec_from_hf_config({**config, "rope_parameters": {
        **config["rope_parameters"], "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}}),
        ["of the sliding layers"])


def test_starcoder2_is_a_windowed_grouped_query_layernorm_decoder() -> None:
    spec = spec_from_hf_config(OTHERS["starcoder2-3b"])
    att, s = spec.decoder.attention, spec.decoder
    assert (att.n_heads, att.n_kv_heads, att.sliding_window, att.bias, s.ffn.bias) == (24, 2, 4096, True, True)
    assert (s.norm.type, s.residual.type, s.residual.dropout, spec.embedding.dropout) == ("layernorm", "sequential",
                                                                                       0.1, 0.1)
    assert spec.embedding.tie_output and spec.positional.base == 999999.4420358813
    config = hf_config_from_spec(spec)
    assert (config["model_type"], config["sliding_window"], config["num_key_value_heads"]) == ("starcoder2", 4096, 2)
    # multi-query without a window is Falcon's structure: imported weights go back as StarCoder2's
    mqa = spec_from_hf_config({**OTHERS["starcoder2-3b"], "num_key_value_heads": 1, "sliding_window": None,
                               "use_bias": False})
    assert hf_family(mqa) == "falcon"
    assert hf_config_from_spec(mqa, imported_as="starcoder2")["model_type"] == "starcoder2"


def test_phi_qk_layernorm_is_a_layernorm_over_each_query_and_key_head() -> None:
    spec = spec_from_hf_config({**OTHERS["phi-2"], "qk_layernorm": True})
    att = spec.decoder.attention
    assert (att.qk_norm, att.qk_norm_scope, att.qk_norm_eps) == ("layernorm", "head", 1e-5)  # layer_norm_eps
    # a weight and a bias over each head's features, for queries and for keys
    assert count_parameters(spec).total - count_parameters(spec_from_hf_config(OTHERS["phi-2"])).total == (
        spec.decoder.n_layers * 2 * 2 * att.head_dim)
    config = hf_config_from_spec(spec)
    assert config["qk_layernorm"] is True and spec_from_hf_config(config, name=spec.name) == spec


def test_gptj_rotary_dim_must_be_an_even_share_of_a_head() -> None:
    _refused(lambda: spec_from_hf_config({**OTHERS["gpt-j-6b"], "rotary_dim": None}), ["rotary_dim=None"])
    _refused(lambda: spec_from_hf_config({**OTHERS["gpt-j-6b"], "rotary_dim": 63}), ["rotary_dim=63", "even"])
    # a share whose float is not exact still gives rotary_dim features (int(head_dim * fraction))
    odd = spec_from_hf_config({**OTHERS["gpt-j-6b"], "n_embd": 1200, "n_head": 12, "rotary_dim": 58})
    assert int(100 * odd.positional.fraction) == 58


def test_mistral_is_grouped_query_with_a_sliding_window() -> None:
    att = spec_from_hf_config(OTHERS["mistral-7b"]).decoder.attention
    assert (att.n_heads, att.n_kv_heads, att.head_dim, att.sliding_window) == (32, 8, 128, 4096)


def test_pythia_is_partial_rotary_with_parallel_residual() -> None:
    spec = spec_from_hf_config(OTHERS["pythia-160m"])
    assert spec.positional.type == "rope" and spec.positional.fraction == 0.25
    assert spec.decoder.residual.type == "parallel"
    assert spec.decoder.norm.type == "layernorm" and spec.decoder.attention.bias
    assert not spec.embedding.tie_output


def test_bart_shares_tokens_but_not_positions() -> None:
    spec = spec_from_hf_config(OTHERS["bart-base"])
    assert (spec.positional.max_positions, spec.positional.offset, spec.max_seq_len) == (1026, 2, 1024)
    assert spec.embedding.share_encoder_decoder and not spec.embedding.share_positions
    assert spec.embedding.norm.type == "layernorm" and spec.encoder.norm.placement == "post"
    assert spec.decoder.ffn.dropout == 0.1 and spec.decoder.attention.dropout == 0.1
    assert count_parameters(spec).total == 139_420_416  # bart-base with its zero logits bias left out


def test_mt5_is_t5_v1_1_with_a_large_vocabulary() -> None:
    spec = spec_from_hf_config(OTHERS["mt5-small"])
    v1_1 = spec_from_hf_config({**OTHERS["t5-v1_1-small"], "vocab_size": 250112})
    assert spec.model_copy(update={"name": v1_1.name, "training": v1_1.training}) == v1_1
    assert count_parameters(spec).total == 300_176_768  # mt5-small, its untied output layer included
    roberta = spec_from_hf_config({**OTHERS["roberta-base"], "vocab_size": 250002})
    xlmr = spec_from_hf_config(OTHERS["xlm-roberta-base"])
    assert xlmr.model_copy(update={"name": roberta.name, "training": roberta.training}) == roberta


def test_t5_v1_1_is_gated_gelu_untied_and_unscaled() -> None:
    spec = spec_from_hf_config(OTHERS["t5-v1_1-small"])
    ffn = spec.encoder.ffn
    assert (ffn.type, ffn.activation, ffn.d_ff) == ("glu", "gelu_tanh", 1024)
    assert not spec.embedding.tie_output and not spec.head.scale_input
    assert spec.decoder.n_layers == 8 and spec.encoder.attention.n_heads == 6


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({**PUBLISHED["gpt2-small"], "scale_attn_by_inverse_layer_idx": True}, ["scale_attn_by_inverse_layer_idx"]),
        ({**PUBLISHED["bert-base"], "position_embedding_type": "relative_key"}, ["relative_key"]),
        # a rope type of transformers' with no equivalent, under its 4.x key too; the message
        # names what does import
        ({**PUBLISHED["llama2-7b"], "rope_scaling": {"type": "proportional"}},
         ["rope scaling 'proportional'", "'default', 'linear', 'llama3', 'yarn', 'dynamic', 'longrope' import"]),
        ({**PUBLISHED["llama2-7b"], "rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         ["rope scaling 'llama3' has no low_freq_factor"]),
        ({**PUBLISHED["llama2-7b"], "hidden_act": "quick_gelu"}, ["quick_gelu", "silu"]),
        # transformers 5's Llama/Mistral ignore it (4.x honoured it): which model is unknown
        ({**PUBLISHED["llama2-7b"], "partial_rotary_factor": 0.5}, ["partial_rotary_factor=0.5", "ignores"]),
        ({**OTHERS["mistral-7b"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                         "partial_rotary_factor": 0.25}},
         ["partial_rotary_factor=0.25"]),
        # OLMo-7B-0424's clamp of the query, key and value projections
        ({"model_type": "olmo", "hidden_size": 64, "num_attention_heads": 4, "clip_qkv": 8.0},
         ["clip_qkv=8.0", "does not clamp"]),
        ({"model_type": "whisper"}, ["whisper", "not supported", "gpt2", "xlm-roberta", "mt5"]),
        ({"hidden_size": 64}, ["model_type"]),
    ],
)
def test_inexpressible_configs_are_refused_by_name(config: dict[str, Any], words: list[str]) -> None:
    _refused(lambda: spec_from_hf_config(config), words)


def test_read_config_from_a_directory_a_file_and_bad_json(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["gpt2-small"]))
    assert read_hf_config(tmp_path) == PUBLISHED["gpt2-small"]
    assert spec_from_hf_config(tmp_path / "config.json", name="gpt2-small") == load_spec("gpt2-small")
    (tmp_path / "bad.json").write_text('{"model_type": "gpt2",\n  oops}')
    with pytest.raises(HFConversionError, match=r"bad.json:2:\d+: not valid JSON"):
        read_hf_config(tmp_path / "bad.json")
    with pytest.raises(HFConversionError, match="no such file"):
        read_hf_config(tmp_path / "missing")
    # a specformer spec given to import-hf is named as one, not as broken JSON
    (tmp_path / "my.yaml").write_text("extends: gpt-nano\nname: mine\n")
    with pytest.raises(HFConversionError) as err:
        read_hf_config(tmp_path / "my.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'my.yaml'}: a YAML file, not a Hugging Face config.json; ")
    assert "not valid JSON" not in str(err.value) and "specformer validate" in str(err.value)


# --------------------------------------------------------------------------- spec -> config


@pytest.mark.parametrize("preset", sorted(PUBLISHED) + ["gpt-nano", "bert-nano"])
def test_export_config_round_trips(preset: str) -> None:
    spec = load_spec(preset)
    config = hf_config_from_spec(spec)
    back = spec_from_hf_config(config, name=preset)
    # the training section is not part of a Hugging Face config
    assert back.model_copy(update={"training": spec.training}) == spec


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_export_config_round_trips_other_families(name: str) -> None:
    spec = spec_from_hf_config(OTHERS[name])
    config = hf_config_from_spec(spec)
    model_type = OTHERS[name]["model_type"]
    # mT5 and XLM-RoBERTa are T5's and RoBERTa's models, and a windowed Phi-3 that rotates every
    # feature is Mistral's: they export as those (under their own names with imported_as)
    assert config["model_type"] == {"mt5": "t5", "xlm-roberta": "roberta", "phi3": "mistral"}.get(
        model_type, model_type)
    assert spec_from_hf_config(config, name=spec.name) == spec


@pytest.mark.parametrize(
    ("preset", "overrides", "words"),
    [
        # grouped keys on GPT-2's decoder: GPT-BigCode, which has one key/value head or one per query head
        ("gpt2-small", ["decoder.attention.n_kv_heads=4"], ["gpt_bigcode", "decoder.attention.n_kv_heads = 4 "
                                                            "(Hugging Face gpt_bigcode has 12)"]),
        ("gpt2-small", ["decoder.attention.n_kv_heads=1"], []),
        ("gpt2-small", ["decoder.norm.eps=1e-6", "decoder.ffn.activation=relu"], []),
        ("gpt2-small", ["embedding.scale=true"], ["embedding.scale = True"]),
        # a Llama with q/k norms is Qwen3, whose q/k norms take the stack's eps
        ("llama2-7b", ["decoder.attention.qk_norm=rmsnorm"], ["qwen3", "decoder.attention.qk_norm_eps = 1e-06 "
                                                              "(Hugging Face qwen3 has 1e-05)",
                                                              "--set decoder.attention.qk_norm_eps=1e-05"]),
        ("llama2-7b", ["decoder.attention.qk_norm=rmsnorm", "decoder.attention.qk_norm_eps=1e-5"], []),
        ("llama2-7b", ["decoder.attention.qk_norm=rmsnorm", "decoder.norm.eps=1e-6"], []),
        ("llama2-7b", ["decoder.attention.qk_norm=layernorm", "decoder.norm.eps=1e-6"],
         ["decoder.attention.qk_norm = 'layernorm' (Hugging Face qwen3 has 'rmsnorm')"]),
        ("llama2-7b", ["decoder.attention.qk_norm=rmsnorm", "decoder.norm.eps=1e-6", "decoder.ffn.bias=true"],
         ["decoder.ffn.bias = True (Hugging Face qwen3 has False)"]),
        # biases on q, k and v but none on the output projection: Qwen2, which no other family has
        ("llama2-7b", ["decoder.attention.bias=true", "decoder.attention.out_bias=false"], []),
        ("gpt2-small", ["decoder.attention.out_bias=false"], ["decoder.attention.out_bias = False (Hugging Face "
                                                              "gpt2 has True)"]),
        ("bert-base", ["encoder.norm.placement=pre"], ["encoder.norm.placement = 'pre'"]),
        # the original Transformer is Marian's model, with its sinusoids in halves and eps 1e-5
        ("transformer-base", [], ["marian", "positional.layout = 'interleaved' (Hugging Face marian has 'halves')",
                                  '--set positional.layout="halves"', "encoder.norm.eps = 1e-06"]),
        # t5-nano keeps the usual 1/sqrt(head_dim) softmax scale; T5 has none
        ("t5-nano", [], ["encoder.attention.scale = None (Hugging Face t5 has 1.0)"]),
        # dynamic NTK grows the base past max_position_embeddings there, and past its own length here
        ("llama2-7b", ["positional.scaling={type: dynamic, factor: 2, original_max_position_embeddings: 4096}"], []),
        ("llama2-7b", ["positional.scaling={type: dynamic, factor: 2, original_max_position_embeddings: 2048}"],
         ["positional.scaling.original_max_position_embeddings = 2048 (Hugging Face llama has 4096)"]),
        # a masked-LM head on a family whose head is an lm head is named, as GPT-2's is
        ("t5-small", ["head.type=mlm"], ["head.type = 'mlm' (Hugging Face t5 has 'lm')", '--set head.type="lm"']),
        ("gpt-nano", ["head.type=mlm"], ["head.type = 'mlm' (Hugging Face gpt2 has 'lm')"]),
        # a heterogeneous stack is named by its layers, not dumped override by override
        ("gpt-nano", ["decoder.overrides=[{layers: [0], attention: {sliding_window: 8}}]", "embedding.norm={}"],
         ["decoder.overrides = 1 per-layer override (layers [0]) (Hugging Face gpt2 has [])",
          "embedding.norm = {type: 'layernorm', eps: 1e-05, placement: 'pre', bias: True, weight: True} (Hugging Face gpt2 has None)"]),
    ],
)
def test_export_refuses_fields_with_no_equivalent(preset: str, overrides: list[str], words: list[str]) -> None:
    spec = load_spec(preset, overrides)
    if not words:  # fields the family does express: no error
        back = spec_from_hf_config(hf_config_from_spec(spec), name=preset)
        assert back.model_copy(update={"training": spec.training}) == spec
        return
    _refused(lambda: hf_config_from_spec(spec), words)


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [
        # layernorm has a bias, T5's rmsnorm none: setting the type drops it
        ("t5-nano", ["encoder.norm.type=layernorm", "decoder.norm.type=layernorm"]),
        # rmsnorm has no bias, GPT-2's layernorm has one: the type first, then the bias
        ("gpt-nano", ["decoder.norm.type=rmsnorm", "decoder.attention.bias=false"]),
    ],
)
def test_export_refusal_hint_is_a_set_that_exports(preset: str, overrides: list[str]) -> None:
    message = _refused(lambda: hf_config_from_spec(load_spec(preset, overrides)), ["from the start exports: "])
    hint = message.rsplit("from the start exports: ", 1)[1].strip()
    sets = [s.split("=", 1) for s in hint.removeprefix("--set ").split(" --set ")]
    # the hint's values are JSON, which YAML reads as the same values
    fixed = load_spec(preset, overrides + [f"{path}={value}" for path, value in sets])
    assert hf_config_from_spec(fixed)["model_type"] == ("t5" if preset.startswith("t5") else "gpt2")
    assert "norm.bias=null" not in hint
    if preset == "t5-nano":
        assert "encoder.norm.bias = True (Hugging Face t5's type has no such field)" in message


@pytest.mark.parametrize("name", ["roberta-base", "bart-base"])
def test_export_takes_a_learned_table_left_to_its_default_size(name: str) -> None:
    # max_positions: null means max_seq_len + offset, which is what the family has
    spec = spec_from_hf_config(OTHERS[name])
    data = spec.to_dict()
    data["positional"]["max_positions"] = None
    config = hf_config_from_spec(load_spec(data))
    assert config["max_position_embeddings"] == OTHERS[name]["max_position_embeddings"]


def test_export_warns_about_training_only_differences() -> None:
    spec = load_spec("bert-base", ["encoder.ffn.dropout=0.2", "init.scaled_residual=true"])
    warnings: list[str] = []
    config = hf_config_from_spec(spec, warnings=warnings)
    assert config["model_type"] == "bert"
    assert any("encoder.ffn.dropout" in w for w in warnings)
    assert any("init.scaled_residual" in w for w in warnings)


def test_export_says_a_training_only_setting_left_out_does_not_change_the_outputs() -> None:
    # a Llama-like spec written from scratch keeps init.scaled_residual's default (true),
    # which Llama's config cannot say: the warning must not read as a changed model
    spec = load_spec({"name": "tiny", "kind": "decoder", "vocab_size": 128, "d_model": 64, "max_seq_len": 32,
                      "positional": {"type": "rope"}, "embedding": {"tie_output": False},
                      "decoder": {"n_layers": 1, "attention": {"n_heads": 4, "n_kv_heads": 2, "bias": False},
                                  "ffn": {"type": "glu", "activation": "silu"}, "norm": {"type": "rmsnorm"}}})
    warnings: list[str] = []
    assert hf_config_from_spec(spec, warnings=warnings)["model_type"] == "llama"
    assert warnings == ["left out of the export: init.scaled_residual = True (Hugging Face llama has False): an "
                        "init setting only chose the weights the run started from; the exported weights compute "
                        "the same outputs"]
    warnings = []
    hf_config_from_spec(load_spec("bert-base", ["encoder.ffn.dropout=0.2"]), warnings=warnings)
    assert warnings == ["left out of the export: encoder.ffn.dropout = 0.2 (Hugging Face bert has 0.0): dropout "
                        "acts in training only; the exported model's outputs (eval mode) are the same, and "
                        "fine-tuning it in transformers uses bert's value"]


@pytest.mark.reference
@pytest.mark.parametrize("tied", [True, False])
def test_t5_init_has_the_stds_of_hugging_face_t5(tied: bool) -> None:
    # each weight's std is that of the same weight in a T5ForConditionalGeneration built
    # from the exported config (its _init_weights); a T5 config imports as scheme t5
    transformers = pytest.importorskip("transformers", reason="the [hf] extra (transformers) is not installed")
    import torch

    from specformer import build_model
    from specformer.interop.hf_weights import specformer_to_hf

    sets = ["d_model=256", f"embedding.tie_output={str(tied).lower()}", "init={scheme: t5}"]
    sets += [f"{r}.scale=1.0" for r in ("encoder.attention", "decoder.attention", "decoder.cross_attention")]
    spec = load_spec("t5-nano", sets)
    config = hf_config_from_spec(spec)
    assert spec_from_hf_config(config).init == spec.init
    torch.manual_seed(0)
    ours = specformer_to_hf(build_model(spec).state_dict(), spec)
    theirs = transformers.T5ForConditionalGeneration(transformers.AutoConfig.for_model(**config)).state_dict()
    for name, weight in theirs.items():
        if weight.dim() == 2 and weight.numel() >= 4096:
            std = weight.float().std().item()
            assert ours[name].std().item() == pytest.approx(std, rel=0.1), (name, std)


def test_a_t5_config_imports_with_t5s_init_and_another_init_exports_with_a_warning() -> None:
    assert spec_from_hf_config(PUBLISHED["t5-small"]).init.scheme == "t5"
    warnings: list[str] = []
    hf_config_from_spec(load_spec("t5-small", ["init={scheme: normal, scaled_residual: false}"]), warnings=warnings)
    assert any("init.scheme = 'normal'" in w for w in warnings)


# --------------------------------------------------------------------------- architectures: which head

_TINY_BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
              "intermediate_size": 64, "vocab_size": 101}
_TINY_GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 1, "n_head": 4, "vocab_size": 101}
_TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
               "intermediate_size": 64, "vocab_size": 101}


def _with(config: dict[str, Any], *architectures: str, **extra: Any) -> dict[str, Any]:
    return {**config, "architectures": list(architectures), **extra}


@pytest.mark.parametrize(
    ("config", "head"),
    [
        (_TINY_BERT, "mlm"),  # no architectures: the family's own head
        (_with(_TINY_BERT, "BertForMaskedLM"), "mlm"),
        (_with(_TINY_BERT, "BertForPreTraining"), "mlm"),  # + next-sentence prediction, left out
        (_with(_TINY_GPT2, "GPT2LMHeadModel"), "lm"),
        (_with(_TINY_LLAMA, "LLaMAForCausalLM"), "lm"),  # the class name of early Llama conversions
        # bare models whose LM head is the tied token embeddings: the checkpoint has every weight
        (_with(_TINY_GPT2, "GPT2Model"), "lm"),
        (_with(_TINY_LLAMA, "LlamaModel", tie_word_embeddings=True), "lm"),
        (_with(OTHERS["bart-base"], "BartModel"), "lm"),
        (_with(PUBLISHED["t5-small"], "T5Model"), "lm"),
        (_with(_TINY_BERT, "BertForSequenceClassification"), "classification"),
        (_with({**OTHERS["roberta-base"], "architectures": []}, "RobertaForSequenceClassification"),
         "classification"),
    ],
)
def test_architectures_pick_a_head_specformer_has(config: dict[str, Any], head: str) -> None:
    assert spec_from_hf_config(config).head.type == head


def test_sequence_classification_is_the_classification_head() -> None:
    config = _with(_TINY_BERT, "BertForSequenceClassification", id2label={"0": "neg", "1": "neu", "2": "pos"},
                   hidden_dropout_prob=0.3)
    head = spec_from_hf_config(config).head
    # the first token through BertPooler (dense + tanh), dropout, then the classifier
    assert (head.n_classes, head.pooling, head.pooler, head.dropout) == (3, "first", True, 0.3)
    head = spec_from_hf_config({**config, "classifier_dropout": 0.05, "id2label": None, "num_labels": 5}).head
    assert (head.n_classes, head.dropout) == (5, 0.05)
    head = spec_from_hf_config({**config, "problem_type": "single_label_classification"}).head
    assert head.n_classes == 3
    # class names come along (transformers' LABEL_i defaults are left out), and go back out
    assert spec_from_hf_config(config).head.labels == ("neg", "neu", "pos")
    default = {str(i): f"LABEL_{i}" for i in range(3)}
    assert spec_from_hf_config({**config, "id2label": default}).head.labels is None
    exported = hf_config_from_spec(spec_from_hf_config(config), warnings=[])
    assert exported["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}
    assert exported["label2id"] == {"neg": 0, "neu": 1, "pos": 2}


@pytest.mark.parametrize(("labels", "words"), [(["a", "b"], "2 labels for n_classes=3"),
                                                (["a", "b", "a"], "repeated label names: 'a'")])
def test_classification_labels_name_each_class_once(labels: list[str], words: str) -> None:
    from specformer.specs.errors import SpecError

    with pytest.raises(SpecError, match=words):
        load_spec({**load_spec("bert-nano").to_dict(), "head": {"type": "classification", "n_classes": 3,
                                                                 "labels": labels}})


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (_with(_TINY_BERT, "BertForQuestionAnswering"),
         ["['BertForQuestionAnswering']", "specformer has no question-answering head",
          "supported bert architectures: BertForMaskedLM, BertForPreTraining, BertForSequenceClassification"]),
        (_with(_TINY_BERT, "BertForTokenClassification"), ["no token-classification head"]),
        (_with(_TINY_BERT, "BertForMultipleChoice"), ["no multiple-choice head"]),
        (_with(_TINY_BERT, "BertForNextSentencePrediction"), ["no next-sentence-prediction head"]),
        (_with(_TINY_BERT, "BertLMHeadModel"), ["causal language model", "masked-LM encoder"]),
        (_with(OTHERS["roberta-base"], "RobertaForTokenClassification"),
         ["no token-classification head", "RobertaForSequenceClassification"]),
        (_with(_TINY_GPT2, "GPT2DoubleHeadsModel"), ["no multiple-choice head"]),
        (_with(PUBLISHED["t5-small"], "T5EncoderModel"), ["the encoder alone", "T5ForConditionalGeneration"]),
        # other families' sequence classifiers are other heads
        (_with(_TINY_GPT2, "GPT2ForSequenceClassification"),
         ["GPT2ForSequenceClassification is not specformer's classification head", "without bias",
          "GPT2LMHeadModel, GPT2Model"]),
        (_with(_TINY_LLAMA, "LlamaForSequenceClassification"), ["without bias", "LlamaForCausalLM"]),
        (_with(OTHERS["bart-base"], "BartForSequenceClassification"), ["end-of-sequence token"]),
        # bare models whose head has weights of its own, which their checkpoints lack
        (_with(_TINY_BERT, "BertModel"), ["BertModel is the bare bert encoder", "masked-LM head",
                                          "cls.predictions.*", "BertForMaskedLM"]),
        (_with(OTHERS["roberta-base"], "RobertaModel"), ["bare roberta encoder", "lm_head.*"]),
        (_with(_TINY_LLAMA, "LlamaModel"), ["bare llama decoder", "tie_word_embeddings is false",
                                            "lm_head.weight", "llama architectures: LlamaForCausalLM"]),
        (_with(OTHERS["t5-v1_1-small"], "T5Model"), ["bare t5 encoder-decoder", "lm_head.weight"]),
        (_with(_TINY_BERT, "MyBertClassifier"), ["MyBertClassifier is not a bert class specformer knows"]),
        # another decoder's class under a decoder family: not a masked-LM encoder's refusal
        (_with(_TINY_LLAMA, "Qwen2ForCausalLM"), ["Qwen2ForCausalLM is not a llama class specformer knows",
                                                  "llama architectures: LlamaForCausalLM"]),
        (_with(_TINY_BERT, "BertForMaskedLM", "BertForSequenceClassification"), ["different heads"]),
        # specformer trains a classification head with softmax cross-entropy
        (_with(_TINY_BERT, "BertForSequenceClassification", num_labels=1, id2label=None),
         ["problem_type='regression' (num_labels=1)", "softmax cross-entropy"]),
        (_with(_TINY_BERT, "BertForSequenceClassification", problem_type="multi_label_classification"),
         ["problem_type='multi_label_classification'"]),
    ],
)
def test_heads_specformer_does_not_have_are_refused_by_name(config: dict[str, Any], words: list[str]) -> None:
    _refused(lambda: spec_from_hf_config(config), words)


@pytest.mark.parametrize("base", ["bert-nano", "roberta-base"])
def test_export_of_a_classification_head_round_trips(base: str) -> None:
    spec = spec_from_hf_config(OTHERS[base]) if base in OTHERS else load_spec(base)
    spec = load_spec({**spec.to_dict(), "head": {"type": "classification", "n_classes": 4, "dropout": 0.1}})
    config = hf_config_from_spec(spec, warnings=[])
    family = "Bert" if base.startswith("bert") else "Roberta"
    assert config["architectures"] == [f"{family}ForSequenceClassification"]
    assert len(config["id2label"]) == 4 and config["problem_type"] == "single_label_classification"
    assert config["classifier_dropout"] == 0.1
    back = spec_from_hf_config(config, name=spec.name)
    assert back.model_copy(update={"training": spec.training}) == spec  # training is not part of it


def test_export_warns_that_roberta_classifier_drops_out_twice() -> None:
    spec = spec_from_hf_config(_with(OTHERS["roberta-base"], "RobertaForSequenceClassification"))
    warnings: list[str] = []
    hf_config_from_spec(spec, warnings=warnings)
    assert any("head.dropout = 0.1" in w and "before its dense layer" in w for w in warnings)


@pytest.mark.parametrize(
    ("preset", "overrides", "words", "absent"),
    [
        ("gpt-nano", ["head.type=classification", "head.pooling=last", "head.pooler=false"],
         ["head: classification has no Hugging Face gpt2 equivalent", "without bias",
          "BertForSequenceClassification"], ["--set"]),
        ("t5-small", ["head.type=classification"], ["no Hugging Face t5 equivalent", "end-of-sequence"], []),
        ("bert-nano", ["head.type=classification", "head.pooling=mean"],
         ["head.pooling = 'mean' (Hugging Face bert has 'first')"], ["head.n_classes"]),
        # another kind of head is named by its type, not by each field the two heads do not share
        ("bert-nano", ["head.type=lm"], ["head.type = 'lm' (Hugging Face bert has 'mlm')"],
         ["head.activation", "head.scale_input"]),
    ],
)
def test_export_of_a_head_the_family_lacks_is_refused_by_name(
    preset: str, overrides: list[str], words: list[str], absent: list[str]
) -> None:
    message = _refused(lambda: hf_config_from_spec(load_spec(preset, overrides)), words)
    for word in absent:
        assert word not in message


@pytest.mark.parametrize("preset", ["gpt-nano", "bert-nano", "t5-small"])
def test_settings_that_compute_the_same_export_as_the_defaults(preset: str) -> None:
    spec = load_spec(preset)
    stack = "decoder" if spec.kind == "decoder" else "encoder"
    head_dim = getattr(spec, stack).attention.head_dim
    same = load_spec(preset, overrides=[f"{stack}.attention.backend=eager",
                                        f"{stack}.attention.scale={head_dim ** -0.5!r}"])
    if spec.kind == "encoder-decoder":  # t5 has scale 1.0 (no scaling) of its own: only the backend
        same = load_spec(preset, overrides=["encoder.attention.backend=eager", "decoder.attention.backend=eager"])
    assert hf_config_from_spec(same) == hf_config_from_spec(spec)
    other = load_spec(preset, overrides=[f"{stack}.attention.scale=0.3"])
    with pytest.raises(HFConversionError, match=rf"{stack}.attention.scale"):
        hf_config_from_spec(other)


def test_a_config_that_makes_an_invalid_spec_names_the_field_without_pydantics_dump() -> None:
    config = {"model_type": "gpt2", "n_embd": 64, "n_head": 12, "n_layer": 2, "vocab_size": 100}
    message = _refused(lambda: spec_from_hf_config(config), [
        "gpt2 config gives an invalid spec: decoder.attention.n_heads:",
        "d_model=64 is not divisible by n_heads=12",
    ])
    assert "input_value" not in message and "type=" not in message


# meta-llama/Llama-3.1-8B's published config.json, architecture keys verbatim
_LLAMA31 = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_llama_3_1_imports_with_its_rope_scaling_and_exports_it_back() -> None:
    spec = spec_from_hf_config(_LLAMA31)
    assert spec.max_seq_len == 131072
    assert spec.positional.base == 500000.0
    assert spec.positional.scaling.model_dump() == {
        "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert hf_config_from_spec(spec)["rope_parameters"] == {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    }
    assert spec_from_hf_config(hf_config_from_spec(spec)).model_copy(update={"name": spec.name}) == spec


@pytest.mark.parametrize(
    ("rope", "extra", "scaling"),
    [
        # transformers 4.x's key and name
        ({"type": "linear", "factor": 4}, {}, {"type": "linear", "factor": 4.0}),
        # YaRN's factor from the two lengths, and the betas and truncation transformers assumes
        ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, {},
         {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
          "beta_slow": 1.0, "attention_factor": None, "mscale": None, "mscale_all_dim": None, "truncate": True}),
        # Qwen2.5's: the original length is max_position_embeddings (a ratio of 1, as transformers
        # accepts it), the factor reaches past it
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, {},
         {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 32.0,
          "beta_slow": 1.0, "attention_factor": None, "mscale": None, "mscale_all_dim": None, "truncate": True}),
        # DeepSeek's mscales (40 x 4096 reaches past max_position_embeddings); gpt-oss's untruncated ramp
        ({"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "mscale": 1.0,
          "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1, "truncate": False}, {},
         {"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
          "beta_slow": 1.0, "attention_factor": None, "mscale": 1.0, "mscale_all_dim": 0.707, "truncate": False}),
        # Phi-3 writes the pretraining length beside the scaling; transformers reads it from there
        ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4},
         {"original_max_position_embeddings": 2048},
         {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 2048}),
        # without any, the model's own length
        ({"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}, {},
         {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32768}),
        # dynamic NTK grows the base past max_position_embeddings, whatever other length is written
        ({"type": "dynamic", "factor": 2}, {}, {"type": "dynamic", "factor": 2.0,
                                                "original_max_position_embeddings": 32768}),
        ({"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 4096},
         {"original_max_position_embeddings": 2048},
         {"type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 32768}),
        # Phi-3's: the pretraining length beside the scaling, the factor from the two lengths
        ({"type": "longrope", "short_factor": [1.0] * 64, "long_factor": [1.5] * 32 + [4.0] * 32},
         {"original_max_position_embeddings": 4096},
         {"type": "longrope", "short_factor": [1.0] * 64, "long_factor": [1.5] * 32 + [4.0] * 32,
          "original_max_position_embeddings": 4096, "factor": 8.0, "attention_factor": None}),
    ],
)
def test_rope_scaling_reads_what_transformers_reads(rope: dict, extra: dict, scaling: dict) -> None:
    config = {**PUBLISHED["llama2-7b"], "max_position_embeddings": 32768, "rope_scaling": rope, **extra}
    spec = spec_from_hf_config(config)
    assert spec.positional.scaling.model_dump() == scaling
    assert spec_from_hf_config(hf_config_from_spec(spec)).model_copy(update={"name": spec.name}) == spec


@pytest.mark.parametrize(
    ("rope", "words"),
    [
        # transformers multiplies cos and sin by an attention_factor of 0: refused, not replaced by the default
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096, "attention_factor": 0},
         ["positional.scaling.attention_factor: input should be greater than 0"]),
        ({"rope_type": "linear", "factor": 0.5}, ["positional.scaling.factor", "greater than or equal to 1"]),
        ({"rope_type": "linear"}, ["rope scaling 'linear' has no factor"]),
        ({"rope_type": "dynamic"}, ["rope scaling 'dynamic' has no factor"]),
        ({"rope_type": "longrope", "short_factor": [1.0] * 64, "original_max_position_embeddings": 8192},
         ["rope scaling 'longrope' has no long_factor"]),
        ({"rope_type": "longrope", "short_factor": [1.0] * 64, "long_factor": [2.0] * 32,
          "original_max_position_embeddings": 8192},
         ["positional.scaling.long_factor", "32 factors, but the rotary has 64 frequencies"]),
        # max_position_embeddings past what the YaRN factor extends the original context to
        ({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 8192},
         ["positional.scaling.factor", "extends original_max_position_embeddings=8192 to 32768 positions, "
          "but max_seq_len=131072 is longer", "use factor: 16"]),
    ],
)
def test_a_rope_scaling_that_makes_an_invalid_spec_is_refused_by_field(rope: dict, words: list[str]) -> None:
    _refused(lambda: spec_from_hf_config({**_LLAMA31, "rope_scaling": rope}), words)


def _export_table() -> dict[str, str]:
    """docs/interop.md's "Which presets export" table: each preset named in it, and what it
    exports as (a model_type, or "refused")."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "interop.md").read_text()
    section = text.split("### Which presets export", 1)[1].split("\n\n", 2)[1]
    table: dict[str, str] = {}
    for row in section.splitlines()[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for preset in re.findall(r"`([^`]+)`", cells[0]):
            table[preset] = cells[1].strip("`")
    # "gpt2-small … gpt2-xl": the sizes between
    if "gpt2-small" in table:
        table.update({n: table["gpt2-small"] for n in ("gpt2-medium", "gpt2-large")})
    return table


def test_docs_export_table_lists_every_preset_as_it_exports() -> None:
    from specformer import preset_names

    table = _export_table()
    assert sorted(table) == sorted(preset_names())
    for preset, exported in table.items():
        if exported == "refused":
            with pytest.raises(HFConversionError):
                hf_config_from_spec(load_spec(preset))
        else:
            assert hf_config_from_spec(load_spec(preset))["model_type"] == exported, preset


def test_a_config_read_from_a_folder_is_named_after_it_as_import_hf_names_it(tmp_path: Path) -> None:
    from specformer.builder import build_model
    from specformer.interop.hf import import_hf, save_hf

    folder = save_hf(build_model("gpt-nano"), None, tmp_path / "my-model")
    config = json.loads((folder / "config.json").read_text())
    assert "_name_or_path" not in config
    names = {spec_from_hf_config(folder).name, spec_from_hf_config(folder / "config.json").name,
             import_hf(folder)[0].name}
    assert names == {"my-model"}
    assert spec_from_hf_config(config).name == "gpt2"  # a dict has no folder: its model_type
    assert spec_from_hf_config({**config, "_name_or_path": "org/tiny-gpt"}).name == "tiny-gpt"


ODD_HEADS = {"name": "odd", "kind": "decoder", "vocab_size": 96, "d_model": 48, "max_seq_len": 32,
             "positional": {"type": "rope"},
             "decoder": {"n_layers": 2, "attention": {"n_heads": 5, "n_kv_heads": 1, "head_dim": 16, "bias": False},
                         "ffn": {"type": "glu", "activation": "gelu_tanh", "d_ff": 40, "bias": False},
                         "norm": {"type": "rmsnorm", "placement": "sandwich", "offset": 1.0, "eps": 1e-6}},
             "embedding": {"scale": True}}


def test_a_config_the_installed_transformers_refuses_is_refused_before_a_file_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # recent Llama and Gemma 2 configs want hidden_size divisible by the head count whatever
    # their head_dim: the folder written would not load, so the export says why instead
    transformers = pytest.importorskip("transformers")
    try:
        transformers.AutoConfig.for_model("gemma2", hidden_size=48, num_attention_heads=5, head_dim=16)
    except Exception:  # noqa: BLE001 - the hub's validation error, or a ValueError
        refused = True
    else:
        refused = False
    spec = load_spec(ODD_HEADS)
    assert export_family(spec) == "gemma2"
    if refused:
        with pytest.raises(HFConversionError, match=r"Hugging Face gemma2 cannot load this spec's config: "
                           r"transformers \S+ refuses it \(The hidden size \(48\) is not a multiple of the number of "
                           r"attention heads \(5\)\); d_model = 48 with n_heads = 5: a d_model that n_heads divides"):
            hf_config_from_spec(spec)
    else:
        assert hf_config_from_spec(spec)["hidden_size"] == 48
    # whatever the version: the config class's refusal, in its own words, as an HFConversionError
    def refuse(model_type: str, **fields: Any) -> Any:
        raise ValueError(f"{model_type} wants something else.")

    monkeypatch.setattr(transformers.AutoConfig, "for_model", refuse)
    with pytest.raises(HFConversionError, match=r"^Hugging Face gpt2 cannot load this spec's config: transformers "
                       r"\S+ refuses it \(gpt2 wants something else\)$"):
        hf_config_from_spec("gpt-nano")


def test_a_llama_whose_config_transformers_refuses_exports_as_phi3_with_the_same_logits() -> None:
    import torch

    transformers = pytest.importorskip("transformers")
    from specformer import build_model
    from specformer.interop.hf import to_hf

    llama = {**ODD_HEADS, "embedding": {}, "decoder": {**ODD_HEADS["decoder"], "norm": {"type": "rmsnorm"},
                                                        "ffn": {"type": "glu", "activation": "silu", "d_ff": 40,
                                                                "bias": False}}}
    spec = load_spec(llama)
    try:
        transformers.AutoConfig.for_model("llama", hidden_size=48, num_attention_heads=5, head_dim=16)
    except Exception:  # noqa: BLE001 - the hub's validation error, or a ValueError
        expected = "phi3"
    else:
        expected = "llama"
    assert export_family(spec) == expected
    torch.manual_seed(0)
    model = build_model(spec).eval()
    theirs = to_hf(model).eval()
    assert theirs.config.model_type == expected
    ids = torch.randint(0, 96, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_head_dim_the_family_has_no_field_for_is_named_where_its_read_back_spec_is_invalid() -> None:
    # Phi has no head_dim: it reads back as d_model / n_heads = 8, whose 0.4 share is 3.2
    # features, no valid spec; the error names head_dim, not the rotary share the user chose
    phi = {"name": "phi-odd", "kind": "decoder", "vocab_size": 96, "d_model": 48, "max_seq_len": 32,
           "positional": {"type": "rope", "fraction": 0.4},
           "decoder": {"n_layers": 2, "attention": {"n_heads": 6, "n_kv_heads": 2, "head_dim": 10,
                                                    "qk_norm": "layernorm", "qk_norm_eps": 1e-5},
                       "ffn": {"type": "mlp", "activation": "gelu_tanh", "d_ff": 64}, "norm": {"type": "layernorm"},
                       "residual": {"type": "parallel", "shared_norm": True}},
           "embedding": {"tie_output": False}, "head": {"type": "lm", "bias": True}}
    with pytest.raises(HFConversionError) as caught:
        hf_config_from_spec(phi)
    assert str(caught.value) == ("the spec has no Hugging Face phi equivalent; these fields differ from what phi can "
                                 "express:\n  decoder.attention.head_dim = 10 (Hugging Face phi has d_model / n_heads = 8)")


def test_an_unsupported_family_names_the_feature_it_needs_where_one_is_known() -> None:
    for model_type, need in (("mixtral", "a mixture-of-experts FFN"), ("mamba", "recurrent or state-space layers"),
                             ("deepseek_v3", "multi-head latent attention and a mixture-of-experts FFN")):
        with pytest.raises(HFConversionError, match=rf"model_type '{model_type}' is not supported: it needs {need}"):
            spec_from_hf_config({"model_type": model_type})
    with pytest.raises(HFConversionError, match=r"model_type 'cohere' is not supported; supported: gpt2"):
        spec_from_hf_config({"model_type": "cohere"})


def test_a_config_that_leaves_out_or_nulls_what_its_class_cannot_default_is_refused() -> None:
    # Mistral's class takes 8 key/value heads where the key is absent: 4 query heads cannot share them
    tiny = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 64, "vocab_size": 100}
    with pytest.raises(HFConversionError, match=r"mistral config: it has no num_key_value_heads, for which mistral's "
                                                r"config class takes 8, and 8 does not divide num_attention_heads=4"):
        spec_from_hf_config(tiny)
    assert spec_from_hf_config({**tiny, "num_key_value_heads": 2}).decoder.attention.n_kv_heads == 2
    with pytest.raises(HFConversionError, match=r"mistral config: vocab_size is null"):
        spec_from_hf_config({**tiny, "num_key_value_heads": 2, "vocab_size": None})
