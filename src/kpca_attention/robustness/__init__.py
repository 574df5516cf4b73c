"""Robustness evaluation: common corruptions and mCE, ImageNet-A/R/O, adversarial attacks in pixel
space, and word-swap attacks on language models."""
