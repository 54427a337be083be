"""Trainable systems from the seeds that are not language-model families (graph and semi-supervised models)."""
