"""Side-by-side speed and memory benchmarks of specformer against Hugging Face
``transformers`` and ``x-transformers``; see ``benchmarks/README.md``."""
