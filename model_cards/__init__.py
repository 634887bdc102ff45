"""The model-card writer of the training scripts."""
