"""Interoperability with other libraries: Hugging Face configs and weights (``hf``).

``transformers`` is an optional dependency (``pip install specformer[hf]``); config
conversion works without it.
"""
