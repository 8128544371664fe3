"""Text-to-speech training pipeline: caches, data loading, model, training, synthesis and diagnosis."""
